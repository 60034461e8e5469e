// Errors and checks. Library code throws qinfer::Error with a one-line message that names the problem;
// the CLI catches it at the top, prints it and exits non-zero.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace qinfer {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string & msg) : std::runtime_error(msg) {}
};

// A device allocation that the card cannot hold: callers that try sizes (the benchmark) report it and go on.
class OutOfMemory : public Error {
public:
    using Error::Error;
};

namespace detail {
// Collects a message through operator<<; Thrower's assignment (which binds after every <<) throws it.
class ErrorBuilder {
public:
    ErrorBuilder(const char * cond, const char * file, int line) {
        if (cond) os_ << "check failed: " << cond << " (" << file << ":" << line << ") ";
    }
    template <typename T> ErrorBuilder & operator<<(const T & v) {
        os_ << v;
        return *this;
    }
    std::string str() const { return os_.str(); }

private:
    std::ostringstream os_;
};

struct Thrower {
    [[noreturn]] void operator=(const ErrorBuilder & b) const { throw Error(b.str()); }
};
}  // namespace detail

}  // namespace qinfer

// QINFER_FAIL() << "what went wrong";  throws qinfer::Error.
#define QINFER_FAIL() ::qinfer::detail::Thrower() = ::qinfer::detail::ErrorBuilder(nullptr, __FILE__, __LINE__)
// QINFER_CHECK(cond) << "context";  an internal invariant; the message names the condition.
#define QINFER_CHECK(cond) \
    if (cond) {            \
    } else                 \
        ::qinfer::detail::Thrower() = ::qinfer::detail::ErrorBuilder(#cond, __FILE__, __LINE__)
#define QINFER_CHECK_EQ(a, b) QINFER_CHECK((a) == (b)) << #a " = " << (a) << ", " #b " = " << (b) << ": "
