#include "runtime/engine.h"

#include "core/check.h"

namespace qinfer {

#ifdef QINFER_CUDA
std::unique_ptr<Engine> make_cuda_engine(const std::string & model_dir, const EngineOptions & opt);
bool cuda_device_present();
bool cuda_available() { return cuda_device_present(); }
#else
bool cuda_available() { return false; }
#endif

std::unique_ptr<Engine> make_engine(const std::string & model_dir, const EngineOptions & opt) {
    if (opt.backend == "cpu") return make_cpu_engine(model_dir, opt);
    if (opt.backend == "cuda" || (opt.backend == "auto" && cuda_available())) {
#ifdef QINFER_CUDA
        if (!cuda_available()) QINFER_FAIL() << "--backend cuda: no CUDA device found";
        return make_cuda_engine(model_dir, opt);
#else
        QINFER_FAIL() << "--backend cuda: this qinfer was built without CUDA";
#endif
    }
    if (opt.backend != "auto") QINFER_FAIL() << "unknown backend '" << opt.backend << "' (auto, cpu, cuda)";
    return make_cpu_engine(model_dir, opt);
}

}  // namespace qinfer
