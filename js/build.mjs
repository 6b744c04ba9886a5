// Bundle js/src into nbresponses/view/static (or --outdir DIR); --check rebuilds into a
// temporary folder and fails if the committed bundle differs from what the source produces.
import { build } from "esbuild";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const committed = resolve(here, "../nbresponses/view/static");
const FILES = ["widget.js", "widget.css"];

async function bundle(outdir) {
  const common = { bundle: true, minify: true, legalComments: "eof", logLevel: "warning" };
  await build({
    ...common,
    entryPoints: [join(here, "src/widget.js")],
    outfile: join(outdir, "widget.js"),
    format: "esm",
    target: ["es2020"],
    platform: "browser",
  });
  await build({ ...common, entryPoints: [join(here, "src/widget.css")], outfile: join(outdir, "widget.css") });
}

const args = process.argv.slice(2);
const outIndex = args.indexOf("--outdir");
if (args.includes("--check")) {
  const tmp = mkdtempSync(join(tmpdir(), "nbr-view-"));
  try {
    await bundle(tmp);
    const stale = FILES.filter((f) => !readFileSync(join(tmp, f)).equals(readFileSync(join(committed, f))));
    if (stale.length) {
      console.error(`stale bundle: ${stale.join(", ")} differ from a fresh build; run npm run build in js/`);
      process.exit(1);
    }
    console.log("bundle is current");
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
} else {
  await bundle(outIndex >= 0 ? resolve(args[outIndex + 1]) : committed);
}
