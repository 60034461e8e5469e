// The kernel timeline of kernel_trace.h: CUPTI's activity API, loaded with dlopen from the library CMake found
// (QINFER_CUPTI_LIBRARY) or from the loader's path. Records arrive in buffers CUPTI fills and hands back (possibly
// on its own thread); each kernel record is copied out with its name demangled.
#include "backends/cuda/kernel_trace.h"

#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "core/check.h"

#if defined(QINFER_HAVE_CUPTI)
#include <cuda_runtime.h>
#include <cupti_activity.h>
#endif

namespace qinfer::cuda {

#if defined(QINFER_HAVE_CUPTI)
namespace {

struct KernelRecord {
    uint64_t start, end, graph_node;
    uint32_t graph, stream;
    int grid[3], block[3];
    std::string name;
};

// The CUPTI entry points used here, resolved at run time.
struct Cupti {
    void * lib = nullptr;
    CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
    CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
    CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
    CUptiResult (*flush_all)(uint32_t) = nullptr;
    CUptiResult (*next_record)(uint8_t *, size_t, CUpti_Activity **) = nullptr;
};

Cupti g_cupti;
std::mutex g_mutex;
std::vector<KernelRecord> g_records;
bool g_registered = false, g_started = false;

constexpr size_t k_buffer_bytes = 8 << 20;
constexpr size_t k_buffer_align = 8;  // CUPTI wants 8-byte aligned buffers

std::string demangle(const char * name) {
    if (!name) return "?";
    int status = 0;
    std::unique_ptr<char, void (*)(void *)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
    return status == 0 && out ? std::string(out.get()) : std::string(name);
}

void CUPTIAPI buffer_requested(uint8_t ** buffer, size_t * size, size_t * max_records) {
    *buffer = static_cast<uint8_t *>(std::aligned_alloc(k_buffer_align, k_buffer_bytes));
    *size = *buffer ? k_buffer_bytes : 0;
    *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t * buffer, size_t, size_t valid_bytes) {
    std::vector<KernelRecord> got;
    CUpti_Activity * record = nullptr;
    while (g_cupti.next_record(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
        if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const auto * k = reinterpret_cast<const CUpti_ActivityKernel10 *>(record);
        got.push_back({k->start, k->end, k->graphNodeId, k->graphId, k->streamId, {k->gridX, k->gridY, k->gridZ},
                       {k->blockX, k->blockY, k->blockZ}, demangle(k->name)});
    }
    std::free(buffer);
    std::lock_guard<std::mutex> lock(g_mutex);
    g_records.insert(g_records.end(), std::make_move_iterator(got.begin()), std::make_move_iterator(got.end()));
}

bool load_cupti(std::string & why) {
    if (g_cupti.lib) return true;
    std::vector<std::string> names;
#if defined(QINFER_CUPTI_LIBRARY)
    names.push_back(QINFER_CUPTI_LIBRARY);
#endif
    names.push_back("libcupti.so");
    names.push_back("libcupti.so.13");
    names.push_back("libcupti.so.12");
    for (const std::string & n : names) {
        if ((g_cupti.lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
    }
    if (!g_cupti.lib) {
        why = "CUPTI (libcupti.so) could not be loaded: " + std::string(dlerror());
        return false;
    }
    auto sym = [&](const char * s) { return dlsym(g_cupti.lib, s); };
    g_cupti.register_callbacks = reinterpret_cast<decltype(g_cupti.register_callbacks)>(sym("cuptiActivityRegisterCallbacks"));
    g_cupti.enable = reinterpret_cast<decltype(g_cupti.enable)>(sym("cuptiActivityEnable"));
    g_cupti.disable = reinterpret_cast<decltype(g_cupti.disable)>(sym("cuptiActivityDisable"));
    g_cupti.flush_all = reinterpret_cast<decltype(g_cupti.flush_all)>(sym("cuptiActivityFlushAll"));
    g_cupti.next_record = reinterpret_cast<decltype(g_cupti.next_record)>(sym("cuptiActivityGetNextRecord"));
    if (!g_cupti.register_callbacks || !g_cupti.enable || !g_cupti.disable || !g_cupti.flush_all || !g_cupti.next_record) {
        why = "the loaded libcupti lacks the activity API";
        dlclose(g_cupti.lib);
        g_cupti = Cupti{};
        return false;
    }
    return true;
}

std::string csv_quoted(const std::string & s) {
    std::string out = "\"";
    for (char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return out + "\"";
}

}  // namespace

bool kernel_trace_start(std::string & why) {
    if (g_started) return true;
    if (!load_cupti(why)) return false;
    if (!g_registered && g_cupti.register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
        why = "CUPTI did not take the activity buffer callbacks (another profiler attached?)";
        return false;
    }
    g_registered = true;  // once a process: the callbacks stay for later traces
    if (g_cupti.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        why = "CUPTI did not start kernel activity recording (another profiler attached?)";
        return false;
    }
    g_started = true;
    return true;
}

size_t kernel_trace_write(const std::string & path) {
    if (!g_started) return 0;
    cudaDeviceSynchronize();  // every kernel recorded has ended
    g_cupti.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);  // partly filled buffers too; their callbacks run before it returns
    g_cupti.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    g_started = false;
    std::vector<KernelRecord> records;
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        records.swap(g_records);
    }
    std::sort(records.begin(), records.end(), [](const KernelRecord & a, const KernelRecord & b) { return a.start < b.start; });
    FILE * f = std::fopen(path.c_str(), "w");
    if (!f) QINFER_FAIL() << "--trace: cannot write " << path;
    std::fprintf(f, "start_ns,end_ns,graph_id,graph_node_id,stream,grid,block,name\n");
    for (const KernelRecord & r : records) {
        std::fprintf(f, "%llu,%llu,%u,%llu,%u,%dx%dx%d,%dx%dx%d,%s\n", static_cast<unsigned long long>(r.start),
                     static_cast<unsigned long long>(r.end), r.graph, static_cast<unsigned long long>(r.graph_node), r.stream, r.grid[0],
                     r.grid[1], r.grid[2], r.block[0], r.block[1], r.block[2], csv_quoted(r.name).c_str());
    }
    std::fclose(f);
    return records.size();
}

void kernel_trace_discard() {
    if (!g_started) return;
    cudaDeviceSynchronize();
    g_cupti.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    std::lock_guard<std::mutex> lock(g_mutex);
    g_records.clear();
}

#else

bool kernel_trace_start(std::string & why) {
    why = "this qinfer was built without CUPTI's headers (cupti_activity.h not found next to the CUDA toolkit)";
    return false;
}

size_t kernel_trace_write(const std::string &) { return 0; }

void kernel_trace_discard() {}

#endif

}  // namespace qinfer::cuda
