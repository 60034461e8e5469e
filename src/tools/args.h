// Command-line options: `--name value` pairs and boolean `--flag`s. Unknown or malformed options are errors.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace qinfer {

class Args {
public:
    // argv[start..] are the options; `flags` names the options that take no value.
    Args(int argc, char ** argv, int start, std::set<std::string> flags);
    bool has(const std::string & key) const;
    std::string str(const std::string & key, const std::string & dflt = "") const;
    std::string required(const std::string & key) const;
    long long integer(const std::string & key, long long dflt) const;
    double number(const std::string & key, double dflt) const;
    bool flag(const std::string & key) const { return has(key); }
    std::vector<int> int_list(const std::string & key) const;  // "1,2,3" or "1 2 3"
    // Throws naming the first option that no command read.
    void check_unused() const;

private:
    std::map<std::string, std::string> values_;
    mutable std::set<std::string> used_;
};

std::vector<int> parse_int_list(const std::string & text, const std::string & what);

// --load-format auto|dummy (vLLM's names): true for dummy, random weights from config.json alone.
bool load_format_dummy(const Args & a);

// --tp N, and across hosts --nnodes N --node-rank R --master-addr HOST:PORT, into the engine's options.
struct EngineOptions;
void parallel_from_args(const Args & a, EngineOptions & eo);

}  // namespace qinfer
