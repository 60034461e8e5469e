#include <gtest/gtest.h>

#include <cstring>

#include "core/check.h"
#include "io/safetensors.h"
#include "test_helpers.h"

using namespace qinfer;
using namespace qinfer::test;

namespace {

SafetensorsHeader parse(const std::vector<uint8_t> & b) { return parse_safetensors(b.data(), b.size(), "t.safetensors"); }

std::string error_of(const std::vector<uint8_t> & b) {
    try {
        parse(b);
    } catch (const Error & e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(Safetensors, ParsesValidHeader) {
    auto b = make_safetensors(R"({"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
                              R"("s":{"dtype":"F32","shape":[],"data_offsets":[12,16]},"z":{"dtype":"I8","shape":[0],"data_offsets":[16,16]}})",
                              16);
    auto h = parse(b);
    ASSERT_EQ(h.tensors.size(), 3u);
    EXPECT_EQ(h.metadata.at("format"), "pt");
    const TensorInfo & a = h.tensors[0];
    EXPECT_EQ(a.name, "a");
    EXPECT_EQ(a.dtype, DType::BF16);
    EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(h.tensors[1].numel(), 1);  // rank 0
    EXPECT_EQ(h.tensors[2].numel(), 0);  // zero-size
}

TEST(Safetensors, RejectsBadInputWithNamedErrors) {
    EXPECT_NE(error_of({1, 2, 3}).find("too short"), std::string::npos);
    std::vector<uint8_t> past(8, 0);
    past[0] = 200;  // header length 200 in an 8-byte file
    EXPECT_NE(error_of(past).find("runs past the end"), std::string::npos);
    EXPECT_NE(error_of(make_safetensors("{not json", 0)).find("not valid JSON"), std::string::npos);
    EXPECT_NE(error_of(make_safetensors("[1,2]", 0)).find("not a JSON object"), std::string::npos);
    EXPECT_NE(error_of(make_safetensors(R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1)).find("unknown dtype 'Q4'"),
              std::string::npos);
    std::string out_of_range = error_of(make_safetensors(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8));
    EXPECT_NE(out_of_range.find("'w' ends at byte 16"), std::string::npos) << out_of_range;
    EXPECT_NE(error_of(make_safetensors(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16)).find("needs 12 bytes"),
              std::string::npos);
    EXPECT_NE(error_of(make_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                        12))
                  .find("overlap"),
              std::string::npos);
    EXPECT_NE(error_of(make_safetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                        R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                        8))
                  .find("appears twice"),
              std::string::npos);
    EXPECT_NE(error_of(make_safetensors(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4)).find("shape"),
              std::string::npos);
    EXPECT_NE(error_of(make_safetensors(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}})", 4))
                  .find("too large"),
              std::string::npos);
    EXPECT_NE(error_of(make_safetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8)).find("begin > end"),
              std::string::npos);
}

TEST(Safetensors, WriterRoundTripsThroughCheckpoint) {
    std::string dir = temp_dir("st-roundtrip");
    SafetensorsWriter w;
    w.add("x", DType::F32, {2, 2});
    w.add("y", DType::BF16, {3});
    w.write(dir + "/model.safetensors", {{"format", "pt"}}, [](size_t i, uint8_t * out, size_t n) {
        for (size_t k = 0; k < n; k++) out[k] = uint8_t(i * 100 + k);
    });
    Checkpoint ck(dir);
    ASSERT_TRUE(ck.has("x"));
    TensorView y = ck.get("y");
    EXPECT_EQ(y.shape(), (std::vector<int64_t>{3}));
    EXPECT_EQ(static_cast<const uint8_t *>(y.data)[5], 105);
    EXPECT_EQ(ck.total_bytes(), 22u);
    EXPECT_THROW(ck.get("nope"), Error);
}

// A writer other than safetensors' own may store a tensor at an offset its element size does not divide (three bytes
// before four floats here): the checkpoint hands out an aligned copy with the same bytes.
TEST(Safetensors, MisalignedTensorReadFromAlignedCopy) {
    std::string dir = temp_dir("st-misaligned");
    std::string header = R"({"b":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"f":{"dtype":"F32","shape":[4],"data_offsets":[3,19]}})";
    while (header.size() % 8 != 0) header.push_back(' ');  // padded as safetensors pads it: only the tensor's offset is odd
    auto b = make_safetensors(header, 19);
    const size_t data_start = 8 + header.size();
    const float values[4] = {1.5f, -2.25f, 3e-3f, 1e30f};
    std::memcpy(b.data() + data_start + 3, values, sizeof(values));
    b[data_start] = 7;
    write_file(dir + "/model.safetensors", b);
    Checkpoint ck(dir);
    TensorView f = ck.get("f");
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data) % alignof(float), 0u);
    const float * got = static_cast<const float *>(f.data);
    for (int i = 0; i < 4; i++) EXPECT_EQ(got[i], values[i]) << i;
    EXPECT_EQ(static_cast<const uint8_t *>(ck.get("b").data)[0], 7);
}

TEST(Safetensors, ShardedFolderAndMissingShard) {
    std::string dir = temp_dir("st-sharded");
    for (int s = 1; s <= 2; s++) {
        SafetensorsWriter w;
        w.add("t" + std::to_string(s), DType::F32, {1});
        w.write(dir + "/model-0000" + std::to_string(s) + "-of-00002.safetensors", {}, [](size_t, uint8_t *, size_t) {});
    }
    write_text(dir + "/model.safetensors.index.json",
               R"({"metadata":{"total_size":8},"weight_map":{"t1":"model-00001-of-00002.safetensors","t2":"model-00002-of-00002.safetensors"}})");
    Checkpoint ck(dir);
    EXPECT_EQ(ck.names(), (std::vector<std::string>{"t1", "t2"}));
    std::filesystem::remove(dir + "/model-00002-of-00002.safetensors");
    try {
        Checkpoint bad(dir);
        FAIL() << "expected an error";
    } catch (const Error & e) {
        EXPECT_NE(std::string(e.what()).find("missing shard model-00002-of-00002.safetensors"), std::string::npos) << e.what();
    }
}

TEST(Safetensors, TruncatedFileOnDisk) {
    std::string dir = temp_dir("st-trunc");
    auto b = make_safetensors(R"({"w":{"dtype":"F32","shape":[100],"data_offsets":[0,400]}})", 400);
    b.resize(b.size() - 100);
    write_file(dir + "/model.safetensors", b);
    try {
        Checkpoint ck(dir);
        FAIL() << "expected an error";
    } catch (const Error & e) {
        EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
    }
}
