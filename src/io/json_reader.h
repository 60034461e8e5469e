// Typed access to a JSON object (config.json, generation_config.json, quantization configs) with one-line errors
// that name the file and the key.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/check.h"

namespace qinfer {

struct JsonReader {
    const nlohmann::json & j;
    const std::string & what;

    bool has(const char * key) const { return j.contains(key) && !j[key].is_null(); }
    int get_int(const char * key) const {
        if (!has(key)) QINFER_FAIL() << what << ": missing key '" << key << "'";
        return get_int_or(key, 0);
    }
    // A non-negative integer up to 2^30.
    int get_int_or(const char * key, int dflt) const {
        if (!has(key)) return dflt;
        const nlohmann::json & v = j[key];
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (int64_t(1) << 30)) {
            QINFER_FAIL() << what << ": '" << key << "' must be a non-negative integer";
        }
        return v.get<int>();
    }
    // Any integer within +-2^30 (e.g. group_size -1).
    int get_signed_int_or(const char * key, int dflt) const {
        if (!has(key)) return dflt;
        const nlohmann::json & v = j[key];
        if (!v.is_number_integer() || v.get<int64_t>() < -(int64_t(1) << 30) || v.get<int64_t>() > (int64_t(1) << 30)) {
            QINFER_FAIL() << what << ": '" << key << "' must be an integer";
        }
        return v.get<int>();
    }
    double get_num_or(const char * key, double dflt) const {
        if (!has(key)) return dflt;
        if (!j[key].is_number()) QINFER_FAIL() << what << ": '" << key << "' must be a number";
        return j[key].get<double>();
    }
    bool get_bool_or(const char * key, bool dflt) const {
        if (!has(key)) return dflt;
        if (!j[key].is_boolean()) QINFER_FAIL() << what << ": '" << key << "' must be true or false";
        return j[key].get<bool>();
    }
    std::string get_str_or(const char * key, const std::string & dflt) const {
        if (!has(key)) return dflt;
        if (!j[key].is_string()) QINFER_FAIL() << what << ": '" << key << "' must be a string";
        return j[key].get<std::string>();
    }
    std::vector<std::string> get_strs(const char * key) const {  // a list of strings
        std::vector<std::string> out;
        if (!has(key)) return out;
        if (!j[key].is_array()) QINFER_FAIL() << what << ": '" << key << "' must be a list of strings";
        for (const auto & e : j[key]) {
            if (!e.is_string()) QINFER_FAIL() << what << ": '" << key << "' must be a list of strings";
            out.push_back(e.get<std::string>());
        }
        return out;
    }
    std::vector<int> get_ids(const char * key) const {  // an int or a list of ints
        std::vector<int> out;
        if (!has(key)) return out;
        const nlohmann::json & v = j[key];
        if (v.is_number_integer()) {
            out.push_back(v.get<int>());
        } else if (v.is_array()) {
            for (const auto & e : v) {
                if (!e.is_number_integer()) QINFER_FAIL() << what << ": '" << key << "' must hold integers";
                out.push_back(e.get<int>());
            }
        } else {
            QINFER_FAIL() << what << ": '" << key << "' must be an integer or a list of integers";
        }
        return out;
    }
};

}  // namespace qinfer
