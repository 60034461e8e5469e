// The TCP rendezvous that lets one run span processes and hosts (tensor parallel with --nnodes): node 0 listens at the
// master address, every other node connects to it, and node 0's bytes (NCCL's unique id) reach every node. Plain
// POSIX sockets; every wait bounded by a timeout, every failure a one-line error naming the address.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace qinfer {

struct MasterAddress {
    std::string host;
    int port = 0;
};
// "host:port" (a name or IPv4 address; port 1..65535); a one-line error otherwise.
MasterAddress parse_master_address(const std::string & text);

// The wire format (little-endian u32s): a node sends "QNFR" + its node number; node 0 answers "QNFR" + the blob's
// length + the blob; the node acknowledges with 'K'. The two parsers of what arrives, for any bytes: the node number
// of a hello (1..nodes-1), the blob length of an answer (at most k_rendezvous_max_blob); one-line errors otherwise.
constexpr size_t k_rendezvous_max_blob = 4096;
int rendezvous_hello_node(const char (&hello)[8], int nodes);
uint32_t rendezvous_blob_size(const char (&head)[8]);

// Node `node` of `nodes`: node 0 sends `blob` (at most 4096 bytes) to the nodes 1.. that connect within
// `timeout_s` and waits for each one's acknowledgement; the others connect (retrying until timeout_s) and return what
// node 0 sent. Node 0 returns `blob`.
std::string rendezvous_broadcast(const MasterAddress & master, int nodes, int node, const std::string & blob, double timeout_s);

}  // namespace qinfer
