// The library's entry point: ONNX Runtime calls RegisterCustomOps when a session's options load
// it, and every operator of the domain ai.nbresponses is added.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

const OrtCustomOp* KVAttentionOp();
const OrtCustomOp* KVAttentionInt8ValuesOp();
const OrtCustomOp* QuantizeRowsOp();
const OrtCustomOp* OutlierProductOp();
const OrtCustomOp* GroupProductOp();
const OrtCustomOp* GatedSiluOp();
const OrtCustomOp* SkipNormOp();

extern "C" OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  // the API of the headers it was built with; ONNX Runtime serves older versions (pyproject
  // requires a runtime newer than the headers nbresponses.models.kernels builds against)
  const OrtApi* api = base->GetApi(ORT_API_VERSION);
  Ort::InitApi(api);
  OrtCustomOpDomain* domain = nullptr;
  if (OrtStatus* status = api->CreateCustomOpDomain("ai.nbresponses", &domain)) return status;
  for (const OrtCustomOp* op :
       {KVAttentionOp(), KVAttentionInt8ValuesOp(), QuantizeRowsOp(), OutlierProductOp(), GroupProductOp(), GatedSiluOp(),
        SkipNormOp()})
    if (OrtStatus* status = api->CustomOpDomain_Add(domain, op)) return status;
  return api->AddCustomOpDomain(options, domain);
}
