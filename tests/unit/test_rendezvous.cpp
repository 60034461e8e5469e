// The TCP rendezvous of tensor parallel across hosts (runtime/rendezvous.h), on loopback: node 0's bytes reach every
// other node whichever starts first; a node that waits for an absent node 0, or a node 0 for absent nodes, stops at
// its timeout with a one-line error; malformed master addresses are refused.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "runtime/rendezvous.h"

using namespace qinfer;

namespace {

// A port free a moment ago (the kernel's choice for port 0).
int free_port() {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    EXPECT_EQ(::bind(s, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    ::getsockname(s, reinterpret_cast<sockaddr *>(&a), &len);
    ::close(s);
    return ntohs(a.sin_port);
}

TEST(Rendezvous, NodeZeroBytesReachEveryNode) {
    for (const bool clients_first : {false, true}) {
        const MasterAddress m{"127.0.0.1", free_port()};
        const std::string blob("\x01\x00nccl-id\xff", 10);
        const int nodes = 4;
        std::vector<std::string> got(nodes);
        std::vector<std::string> errors(nodes);
        std::vector<std::thread> threads;
        auto run = [&](int n) {
            try {
                got[size_t(n)] = rendezvous_broadcast(m, nodes, n, n == 0 ? blob : std::string(), 20);
            } catch (const std::exception & e) {
                errors[size_t(n)] = e.what();
            }
        };
        if (!clients_first) threads.emplace_back(run, 0);
        for (int n = 1; n < nodes; n++) threads.emplace_back(run, n);
        if (clients_first) {
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            threads.emplace_back(run, 0);
        }
        for (auto & t : threads) t.join();
        for (int n = 0; n < nodes; n++) {
            EXPECT_EQ(errors[size_t(n)], "") << "node " << n;
            EXPECT_EQ(got[size_t(n)], blob) << "node " << n;
        }
    }
}

TEST(Rendezvous, AbsentPeersTimeOut) {
    const MasterAddress m{"127.0.0.1", free_port()};
    const auto t0 = std::chrono::steady_clock::now();
    try {
        rendezvous_broadcast(m, 2, 1, "", 0.5);  // node 0 never listens
        ADD_FAILURE() << "node 1 returned without node 0";
    } catch (const std::exception & e) {
        EXPECT_NE(std::string(e.what()).find("no answer from node 0"), std::string::npos) << e.what();
    }
    try {
        rendezvous_broadcast(m, 3, 0, "x", 0.5);  // nodes 1 and 2 never come
        ADD_FAILURE() << "node 0 returned without its nodes";
    } catch (const std::exception & e) {
        EXPECT_NE(std::string(e.what()).find("0 of 2 nodes reached port"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

TEST(Rendezvous, MasterAddresses) {
    const MasterAddress m = parse_master_address("10.0.0.7:29500");
    EXPECT_EQ(m.host, "10.0.0.7");
    EXPECT_EQ(m.port, 29500);
    EXPECT_EQ(parse_master_address("node-a.example:1").host, "node-a.example");
    for (const char * bad : {"", "host", "host:", ":80", "host:0", "host:65536", "host:12ab", "host:1234567"}) {
        EXPECT_THROW(parse_master_address(bad), std::exception) << bad;
    }
    EXPECT_THROW(rendezvous_broadcast(m, 2, 2, "", 1), std::exception);  // node rank out of range
    EXPECT_EQ(rendezvous_broadcast(m, 1, 0, "solo", 1), "solo");         // one node: nothing to exchange
}

}  // namespace
