// The kernel timeline of `qinfer bench --trace` (backends/cuda/kernel_trace.h): kernels launched on a stream and
// kernels replayed from a CUDA graph are both recorded, with their names and ordered times.
#include <fstream>
#include <string>

#include "backends/cuda/kernel_trace.h"
#include "cuda/helpers.h"

namespace qinfer::test {
namespace {

TEST(CudaTrace, RecordsStreamAndGraphKernels) {
    REQUIRE_GPU();
    std::string why;
    if (!cuda::kernel_trace_start(why)) GTEST_SKIP() << why;
    const int hidden = 64, n = 3;
    DeviceBuffer table = upload_bf16(randn(size_t(16) * hidden)), ids = upload(std::vector<int>{1, 5, 9}), x(size_t(n) * hidden * 4, "test");
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    cuda::embedding(table.as<cuda::bf16>(), ids.as<int>(), n, hidden, x.as<float>(), stream);  // on the stream
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cuda::embedding(table.as<cuda::bf16>(), ids.as<int>(), n, hidden, x.as<float>(), stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::string path = ::testing::TempDir() + "qinfer_trace_test.csv";
    const size_t kernels = cuda::kernel_trace_write(path);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    ASSERT_GE(kernels, 2u);
    std::ifstream f(path);
    std::string line;
    std::getline(f, line);
    EXPECT_EQ(line, "start_ns,end_ns,graph_id,graph_node_id,stream,grid,block,name");
    int embedding_rows = 0, in_graph = 0;
    unsigned long long last_start = 0;
    while (std::getline(f, line)) {
        unsigned long long start = 0, end = 0, graph_node = 0;
        unsigned graph_id = 0;
        ASSERT_EQ(std::sscanf(line.c_str(), "%llu,%llu,%u,%llu", &start, &end, &graph_id, &graph_node), 4) << line;
        EXPECT_LE(start, end) << line;
        EXPECT_GE(start, last_start) << "rows in start order";
        last_start = start;
        if (line.find("embedding") == std::string::npos) continue;
        embedding_rows++;
        if (graph_id != 0) in_graph++;
    }
    EXPECT_EQ(embedding_rows, 2);
    EXPECT_EQ(in_graph, 1);
}

}  // namespace
}  // namespace qinfer::test
