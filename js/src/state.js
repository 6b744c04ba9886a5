// The front end's copy of the view state, kept current from the Python side.
//
// Python sends a full snapshot when asked ({kind: "sync"}) and coalesced patches in between;
// the final snapshot also arrives as the synced `_snapshot` trait, so a notebook saved with
// widget state renders without a kernel. Every message carries a sequence number: snapshots
// replace the state when they are not older, patches apply only in order.

export function applyOps(state, ops) {
  for (const [kind, path, value] of ops) {
    let target = state;
    for (let i = 0; i < path.length - 1; i++) target = target[path[i]];
    const last = path[path.length - 1];
    if (kind === "set") {
      target[last] = value === null || typeof value !== "object" ? value : structuredClone(value);
    } else if (kind === "append") {
      target[last] = (target[last] || "") + value;
    } else if (kind === "extend") {
      if (!Array.isArray(target[last])) target[last] = [];
      for (const v of value) target[last].push(v === null || typeof v !== "object" ? v : structuredClone(v));
    }
  }
}

// Which output items a batch of operations touched (null: everything).
export function touchedItems(ops) {
  const touched = new Set();
  for (const [, path] of ops) {
    if (path[0] === "response") {
      if (path.length <= 2) return null;
      if (path[1] === "output") touched.add(path[2]);
    } else if (path[0] === "view" && path[1] === "items") {
      if (path.length <= 2) return null;
      touched.add(path[2]);
    }
  }
  return touched;
}

export function createStore(model, onChange) {
  let seq = -1;
  let state = null;
  let awaitingSync = false;

  const requestSync = () => {
    awaitingSync = true;
    model.send({ kind: "sync" });
  };
  const accept = (snapshot) => {
    if (!snapshot || typeof snapshot !== "object" || !snapshot.state) return;
    if (typeof snapshot.seq !== "number" || snapshot.seq < seq) return;
    seq = snapshot.seq;
    state = structuredClone(snapshot.state);
    awaitingSync = false;
    onChange(null);
  };
  const onTrait = () => accept(model.get("_snapshot"));
  const onMessage = (msg) => {
    if (!msg || typeof msg !== "object") return;
    if (msg.kind === "snapshot") return accept(msg);
    if (msg.kind !== "patch" || state === null || msg.seq <= seq) return;
    if (msg.seq !== seq + 1) {
      if (!awaitingSync) requestSync();
      return;
    }
    try {
      applyOps(state, msg.ops);
    } catch (err) {
      console.warn("nbresponses: bad patch, resyncing", err);
      requestSync();
      return;
    }
    seq = msg.seq;
    onChange(msg.ops);
  };

  model.on("change:_snapshot", onTrait);
  model.on("msg:custom", onMessage);
  accept(model.get("_snapshot"));
  if (!state || state.view.phase !== "done") requestSync();

  return {
    get state() {
      return state;
    },
    dispose() {
      model.off("change:_snapshot", onTrait);
      model.off("msg:custom", onMessage);
    },
  };
}
