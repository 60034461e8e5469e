#include "tools/args.h"

#include <cerrno>
#include <cstdlib>

#include "core/check.h"
#include "runtime/engine.h"
#include "runtime/rendezvous.h"

namespace qinfer {

Args::Args(int argc, char ** argv, int start, std::set<std::string> flags) {
    for (int i = start; i < argc; i++) {
        std::string a = argv[i];
        if (a.size() < 3 || a.rfind("--", 0) != 0) QINFER_FAIL() << "unexpected argument '" << a << "' (options look like --name value)";
        std::string key = a.substr(2), value = "1";
        auto eq = key.find('=');
        if (eq != std::string::npos) {
            value = key.substr(eq + 1);
            key = key.substr(0, eq);
        } else if (!flags.count(key)) {
            if (i + 1 >= argc) QINFER_FAIL() << "option --" << key << " needs a value";
            value = argv[++i];
        }
        values_[key] = value;
    }
}

bool Args::has(const std::string & key) const {
    used_.insert(key);
    return values_.count(key) != 0;
}

std::string Args::str(const std::string & key, const std::string & dflt) const {
    used_.insert(key);
    auto it = values_.find(key);
    return it == values_.end() ? dflt : it->second;
}

std::string Args::required(const std::string & key) const {
    if (!has(key)) QINFER_FAIL() << "missing option --" << key;
    return str(key);
}

long long Args::integer(const std::string & key, long long dflt) const {
    if (!has(key)) return dflt;
    std::string v = str(key);
    char * end = nullptr;
    errno = 0;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno) QINFER_FAIL() << "option --" << key << " needs an integer, got '" << v << "'";
    return x;
}

double Args::number(const std::string & key, double dflt) const {
    if (!has(key)) return dflt;
    std::string v = str(key);
    char * end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0') QINFER_FAIL() << "option --" << key << " needs a number, got '" << v << "'";
    return x;
}

std::vector<int> parse_int_list(const std::string & text, const std::string & what) {
    std::vector<int> out;
    size_t i = 0;
    while (i < text.size()) {
        while (i < text.size() && (text[i] == ',' || text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r')) i++;
        if (i >= text.size()) break;
        size_t j = i;
        if (text[j] == '-') j++;
        while (j < text.size() && text[j] >= '0' && text[j] <= '9') j++;
        if (j == i || (j == i + 1 && text[i] == '-') ||
            (j < text.size() && text[j] != ',' && text[j] != ' ' && text[j] != '\n' && text[j] != '\t' && text[j] != '\r')) {
            QINFER_FAIL() << what << ": '" << text.substr(i, 20) << "' is not an integer";
        }
        long long v = std::strtoll(text.substr(i, j - i).c_str(), nullptr, 10);
        if (v < -2147483648LL || v > 2147483647LL) QINFER_FAIL() << what << ": " << text.substr(i, j - i) << " is out of range";
        out.push_back(int(v));
        i = j;
    }
    return out;
}

std::vector<int> Args::int_list(const std::string & key) const { return parse_int_list(str(key), "--" + key); }

void Args::check_unused() const {
    for (const auto & kv : values_) {
        if (!used_.count(kv.first)) QINFER_FAIL() << "unknown option --" << kv.first;
    }
}

bool load_format_dummy(const Args & a) {
    const std::string f = a.str("load-format", "auto");
    if (f != "auto" && f != "dummy") QINFER_FAIL() << "--load-format must be auto or dummy, got '" << f << "'";
    return f == "dummy";
}

void parallel_from_args(const Args & a, EngineOptions & eo) {
    eo.tp = int(a.integer("tp", 1));
    eo.nnodes = int(a.integer("nnodes", 1));
    eo.node_rank = int(a.integer("node-rank", 0));
    eo.master_addr = a.str("master-addr");
    if (!eo.master_addr.empty()) parse_master_address(eo.master_addr);  // a malformed address fails before any work
}

}  // namespace qinfer
