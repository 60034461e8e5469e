// libFuzzer target: what the TCP rendezvous of tensor parallel across hosts reads from the network (a node's hello,
// node 0's answer header: runtime/rendezvous.h) and the --master-addr text. Any input: a value or a qinfer::Error,
// never a crash.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/check.h"
#include "runtime/rendezvous.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    char msg[8] = {};
    std::memcpy(msg, data, size < sizeof msg ? size : sizeof msg);
    const int nodes = size > 8 ? int(data[8]) : 2;
    try {
        qinfer::rendezvous_hello_node(msg, nodes);
    } catch (const qinfer::Error &) {
    }
    try {
        qinfer::rendezvous_blob_size(msg);
    } catch (const qinfer::Error &) {
    }
    try {
        qinfer::parse_master_address(std::string(reinterpret_cast<const char *>(data), size));
    } catch (const qinfer::Error &) {
    }
    return 0;
}
