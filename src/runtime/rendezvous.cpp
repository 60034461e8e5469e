#include "runtime/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "core/check.h"

namespace qinfer {

namespace {

using Clock = std::chrono::steady_clock;
constexpr char k_magic[4] = {'Q', 'N', 'F', 'R'};

// A socket closed when it goes out of scope.
struct Fd {
    int fd = -1;
    explicit Fd(int f = -1) : fd(f) {}
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
    Fd(Fd && o) noexcept : fd(o.fd) { o.fd = -1; }
    Fd & operator=(Fd && o) noexcept {
        std::swap(fd, o.fd);
        return *this;
    }
    Fd(const Fd &) = delete;
    Fd & operator=(const Fd &) = delete;
};

int ms_left(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return left > 0 ? int(left) : 0;
}

// Waits for `events` on fd until the deadline; false when it passed.
bool wait_for(int fd, short events, Clock::time_point deadline) {
    for (;;) {
        pollfd p{fd, events, 0};
        const int r = ::poll(&p, 1, ms_left(deadline));
        if (r > 0) return true;
        if (r == 0) return false;
        if (errno != EINTR) return false;
    }
}

void send_all(int fd, const void * data, size_t n, Clock::time_point deadline, const std::string & who) {
    const char * p = static_cast<const char *>(data);
    while (n > 0) {
        if (!wait_for(fd, POLLOUT, deadline)) QINFER_FAIL() << "rendezvous: timed out sending to " << who;
        const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (w <= 0) QINFER_FAIL() << "rendezvous: sending to " << who << " failed: " << std::strerror(errno);
        p += w;
        n -= size_t(w);
    }
}

void recv_all(int fd, void * data, size_t n, Clock::time_point deadline, const std::string & who) {
    char * p = static_cast<char *>(data);
    while (n > 0) {
        if (!wait_for(fd, POLLIN, deadline)) QINFER_FAIL() << "rendezvous: timed out waiting for " << who;
        const ssize_t r = ::recv(fd, p, n, 0);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r == 0) QINFER_FAIL() << "rendezvous: " << who << " closed the connection early";
        if (r < 0) QINFER_FAIL() << "rendezvous: reading from " << who << " failed: " << std::strerror(errno);
        p += r;
        n -= size_t(r);
    }
}

void put_u32(std::vector<char> & out, uint32_t v) {
    for (int i = 0; i < 4; i++) out.push_back(char((v >> (8 * i)) & 0xff));
}
uint32_t get_u32(const char * p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= uint32_t(uint8_t(p[i])) << (8 * i);
    return v;
}

std::string where(const MasterAddress & m) { return m.host + ":" + std::to_string(m.port); }

// Node 0: accept nodes - 1 hellos, send each the blob, collect each acknowledgement.
void serve_blob(const MasterAddress & m, int nodes, const std::string & blob, Clock::time_point deadline) {
    Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (listener.fd < 0) QINFER_FAIL() << "rendezvous: no socket: " << std::strerror(errno);
    const int one = 1;
    ::setsockopt(listener.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(uint16_t(m.port));
    if (::bind(listener.fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0) {
        QINFER_FAIL() << "rendezvous: cannot listen on port " << m.port << ": " << std::strerror(errno);
    }
    if (::listen(listener.fd, nodes) != 0) QINFER_FAIL() << "rendezvous: cannot listen on port " << m.port << ": " << std::strerror(errno);
    std::vector<Fd> peers;
    std::vector<bool> seen(size_t(nodes), false);
    std::vector<char> reply(k_magic, k_magic + 4);
    put_u32(reply, uint32_t(blob.size()));
    reply.insert(reply.end(), blob.begin(), blob.end());
    while (int(peers.size()) < nodes - 1) {
        if (!wait_for(listener.fd, POLLIN, deadline)) {
            QINFER_FAIL() << "rendezvous: " << peers.size() << " of " << nodes - 1 << " nodes reached port " << m.port << " in time";
        }
        Fd peer(::accept4(listener.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (peer.fd < 0) continue;
        char hello[8];
        recv_all(peer.fd, hello, sizeof hello, deadline, "a connecting node");
        const int node = rendezvous_hello_node(hello, nodes);
        if (seen[size_t(node)]) QINFER_FAIL() << "rendezvous: node " << node << " of " << nodes << " connected twice";
        seen[size_t(node)] = true;
        send_all(peer.fd, reply.data(), reply.size(), deadline, "node " + std::to_string(node));
        peers.push_back(std::move(peer));
    }
    for (const Fd & p : peers) {
        char ack = 0;
        recv_all(p.fd, &ack, 1, deadline, "a node's acknowledgement");
        if (ack != 'K') QINFER_FAIL() << "rendezvous: a node answered " << int(ack) << " instead of its acknowledgement";
    }
}

// Nodes 1..: connect (retrying while node 0 is not listening yet), say hello, read the blob, acknowledge.
std::string fetch_blob(const MasterAddress & m, int node, Clock::time_point deadline) {
    addrinfo hints{}, * found = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (::getaddrinfo(m.host.c_str(), std::to_string(m.port).c_str(), &hints, &found) != 0 || !found) {
        QINFER_FAIL() << "rendezvous: cannot resolve the master address " << where(m);
    }
    sockaddr_in addr = *reinterpret_cast<const sockaddr_in *>(found->ai_addr);
    ::freeaddrinfo(found);
    Fd conn;
    for (;;) {
        Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        if (s.fd < 0) QINFER_FAIL() << "rendezvous: no socket: " << std::strerror(errno);
        int r = ::connect(s.fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr);
        if (r != 0 && errno == EINPROGRESS && wait_for(s.fd, POLLOUT, deadline)) {
            int err = 0;
            socklen_t len = sizeof err;
            ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len);
            r = err == 0 ? 0 : -1;
        }
        if (r == 0) {
            conn = std::move(s);
            break;
        }
        if (ms_left(deadline) == 0) QINFER_FAIL() << "rendezvous: no answer from node 0 at " << where(m) << " in time";
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, ms_left(deadline))));
    }
    std::vector<char> hello(k_magic, k_magic + 4);
    put_u32(hello, uint32_t(node));
    send_all(conn.fd, hello.data(), hello.size(), deadline, "node 0 at " + where(m));
    char head[8];
    recv_all(conn.fd, head, sizeof head, deadline, "node 0 at " + where(m));
    const uint32_t n = rendezvous_blob_size(head);
    std::string blob(n, '\0');
    recv_all(conn.fd, blob.data(), n, deadline, "node 0 at " + where(m));
    const char ack = 'K';
    send_all(conn.fd, &ack, 1, deadline, "node 0 at " + where(m));
    return blob;
}

}  // namespace

int rendezvous_hello_node(const char (&hello)[8], int nodes) {
    if (std::memcmp(hello, k_magic, 4) != 0) QINFER_FAIL() << "rendezvous: a connection is not a qinfer node";
    const uint32_t node = get_u32(hello + 4);
    if (node == 0 || node >= uint32_t(std::max(nodes, 1))) QINFER_FAIL() << "rendezvous: node " << node << " is not in 1.." << nodes - 1;
    return int(node);
}

uint32_t rendezvous_blob_size(const char (&head)[8]) {
    if (std::memcmp(head, k_magic, 4) != 0) QINFER_FAIL() << "rendezvous: the master is not a qinfer node 0";
    const uint32_t n = get_u32(head + 4);
    if (n > k_rendezvous_max_blob) QINFER_FAIL() << "rendezvous: node 0 sent " << n << " bytes (at most " << k_rendezvous_max_blob << ")";
    return n;
}

MasterAddress parse_master_address(const std::string & text) {
    const size_t colon = text.rfind(':');
    MasterAddress m;
    if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
        QINFER_FAIL() << "--master-addr '" << text << "': expected HOST:PORT";
    }
    m.host = text.substr(0, colon);
    const std::string port = text.substr(colon + 1);
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) < 1 || std::stoi(port) > 65535) {
        QINFER_FAIL() << "--master-addr '" << text << "': the port must be 1..65535";
    }
    m.port = std::stoi(port);
    return m;
}

std::string rendezvous_broadcast(const MasterAddress & master, int nodes, int node, const std::string & blob, double timeout_s) {
    if (nodes < 1 || node < 0 || node >= nodes) QINFER_FAIL() << "--node-rank " << node << " is not in 0.." << nodes - 1;
    if (blob.size() > k_rendezvous_max_blob) QINFER_FAIL() << "rendezvous: " << blob.size() << " bytes to send (at most " << k_rendezvous_max_blob << ")";
    if (nodes == 1) return blob;
    const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
    if (node == 0) {
        serve_blob(master, nodes, blob, deadline);
        return blob;
    }
    return fetch_blob(master, node, deadline);
}

}  // namespace qinfer
