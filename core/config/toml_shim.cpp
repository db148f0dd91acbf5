// toml_shim.cpp: torchtitan's TOML configs through toml++ (a packaged, header-only parser), flattened
// into the manifest's dotted keys. The only C++ in the core: nothing but text and ints crosses into C,
// and no exception leaves this file.
#define TOML_EXCEPTIONS 0
// toml++ 3.3 checks some of its parser's assumptions with assert (abort), and with NDEBUG assumes them
// (undefined behaviour): a table header such as "[[ = 1" breaks one. Here a broken check throws, and
// mf_toml_parse turns it into an error line like any other.
// (Inside the library's few noexcept functions a throw still ends the program, as assert would.)
namespace toml_shim {
struct broken_check {};
[[noreturn, gnu::noinline]] inline void fail() { throw broken_check{}; }
} // namespace toml_shim
#undef NDEBUG
#define TOML_ASSERT(expr) (static_cast<bool>(expr) ? void(0) : toml_shim::fail()) // as assert(), which is constexpr-safe
#include <toml++/toml.h>

#include <cstdio>
#include <cstring>
#include <string>

extern "C" {
#include "base/error.h"
#include "config/toml_shim.h"
}

namespace {

struct walker {
    const char *path;
    int max_depth;
    mf_toml_visit visit;
    void *ctx;
};

int line_of(const toml::node &n) { return static_cast<int>(n.source().begin.line); }

// ct_set_error keeps an error to one line: a key may hold any character, quoted.
ct_status fail(const walker &w, int line, const std::string &key, const char *what) {
    return ct_fail(CT_ERR_INVALID, "%s:%d: %s: %s", w.path, line, key.c_str(), what);
}

// The shortest decimal text that reads back as the same double ("3e-4", not "0.00029999999999999997").
std::string float_text(double x) {
    char buf[64];
    for (int prec = 1; prec <= 17; prec++) {
        std::snprintf(buf, sizeof buf, "%.*g", prec, x);
        if (std::strtod(buf, nullptr) == x) break;
    }
    return buf;
}

// A plain value as text; false (and the error set) for one no manifest holds.
bool scalar_text(const walker &w, const toml::node &n, const std::string &key, std::string &out) {
    if (auto s = n.as_string()) out = s->get();
    else if (auto i = n.as_integer()) out = std::to_string(i->get());
    else if (auto f = n.as_floating_point()) out = float_text(f->get());
    else if (auto b = n.as_boolean()) out = b->get() ? "true" : "false";
    else {
        fail(w, line_of(n), key, n.is_array() || n.is_table() ? "list items must be plain values"
                                                               : "a date or time is no manifest value");
        return false;
    }
    return true;
}

ct_status walk_table(const walker &w, const toml::table &t, const std::string &prefix, int depth);

ct_status walk_value(const walker &w, const toml::node &v, const std::string &key, int depth) {
    if (auto t = v.as_table()) return walk_table(w, *t, key, depth + 1);
    std::string text;
    if (auto a = v.as_array()) {
        bool tables = !a->empty() && (*a)[0].is_table();
        if (tables) { // [[key]]: item i's keys under "key[i]", then the count
            int i = 0;
            for (const toml::node &item : *a) {
                std::string sub = key + "[" + std::to_string(i++) + "]";
                if (!item.is_table()) return fail(w, line_of(item), sub, "a list of tables takes tables only");
                ct_status st = walk_table(w, *item.as_table(), sub, depth + 1);
                if (st != CT_OK) return st;
            }
            return w.visit(w.ctx, key.c_str(), std::to_string(i).c_str(), MF_TOML_ITEMS, line_of(v));
        }
        for (const toml::node &item : *a) {
            if (item.is_array()) // a list of lists: no manifest value, though torchtitan has such keys
                return w.visit(w.ctx, key.c_str(), "", MF_TOML_NESTED, line_of(v));
            std::string one;
            if (!scalar_text(w, item, key, one)) return CT_ERR_INVALID;
            text += (text.empty() ? "" : ",") + one;
        }
        return w.visit(w.ctx, key.c_str(), text.c_str(), MF_TOML_LIST, line_of(v));
    }
    if (!scalar_text(w, v, key, text)) return CT_ERR_INVALID;
    return w.visit(w.ctx, key.c_str(), text.c_str(), MF_TOML_SCALAR, line_of(v));
}

ct_status walk_table(const walker &w, const toml::table &t, const std::string &prefix, int depth) {
    if (depth > w.max_depth)
        return fail(w, line_of(t), prefix, "tables nested deeper than the manifest's limit");
    for (const auto &[k, v] : t) {
        const std::string name(k.str());
        if (name.empty() || name.find_first_of(".[]") != std::string::npos)
            return fail(w, static_cast<int>(k.source().begin.line), prefix + (prefix.empty() ? "" : ".") + name,
                        "keys are plain names (no '.', '[' or ']' inside quotes)");
        ct_status st = walk_value(w, v, prefix.empty() ? name : prefix + "." + name, depth);
        if (st != CT_OK) return st;
    }
    return CT_OK;
}

// Text toml++ 3.3 mishandles is refused before it sees it, with its line and column:
// - a lone CR (TOML ends lines with LF or CRLF): the library asserts on one after '[';
// - a non-ASCII character outside strings and comments (where TOML has none anyway), and as the first
//   character after a multi-line string's line-ending backslash: its whitespace test reaches
//   __builtin_unreachable on most such characters (undefined behaviour).
// The scan follows TOML's four string forms and its comments.
bool refused_text(const char *path, const char *text, size_t n) {
    enum { CODE, COMMENT, BASIC, LITERAL, ML_BASIC, ML_LITERAL } st = CODE;
    int line = 1, col = 0;
    const char *what = nullptr;
    auto at = [&](size_t i, const char *s) { return i + 3 <= n && std::memcmp(text + i, s, 3) == 0; }; // """ or '''
    for (size_t i = 0; i < n && !what; i++) {
        unsigned char c = static_cast<unsigned char>(text[i]);
        col++;
        if (c == '\r' && (i + 1 == n || text[i + 1] != '\n')) what = "a carriage return not followed by a line feed";
        else if (c == '\n') {
            line++, col = 0;
            if (st == COMMENT || st == BASIC || st == LITERAL) st = CODE; // single-line forms end (toml++ reports it)
        } else if (st == CODE) {
            if (c >= 0x80) what = "a non-ASCII character outside a string or comment";
            else if (c == '#') st = COMMENT;
            else if (at(i, "\"\"\"")) st = ML_BASIC, i += 2, col += 2;
            else if (at(i, "'''")) st = ML_LITERAL, i += 2, col += 2;
            else if (c == '"') st = BASIC;
            else if (c == '\'') st = LITERAL;
        } else if (st == BASIC || st == ML_BASIC) {
            if (c == '\\' && i + 1 < n) {
                size_t j = i + 1;
                while (st == ML_BASIC && j < n && (text[j] == ' ' || text[j] == '\t' || text[j] == '\r' || text[j] == '\n')) j++;
                if (j > i + 1 && j < n && static_cast<unsigned char>(text[j]) >= 0x80)
                    what = "a non-ASCII character right after a line-ending backslash (toml++ cannot read it there)";
                else if (j == i + 1) i++, col++; // an escape: the next character is taken as is
            } else if (st == BASIC && c == '"') st = CODE;
            else if (st == ML_BASIC && at(i, "\"\"\"")) st = CODE, i += 2, col += 2;
        } else if (st == LITERAL && c == '\'') st = CODE;
        else if (st == ML_LITERAL && at(i, "'''")) st = CODE, i += 2, col += 2;
    }
    if (!what) return false;
    ct_set_error("%s:%d:%d: TOML syntax error: %s", path, line, col, what);
    return true;
}

} // namespace

extern "C" ct_status mf_toml_parse(const char *path, const char *text, size_t n, int max_depth, mf_toml_visit visit,
                                   void *ctx) {
    if (refused_text(path, text, n)) return CT_ERR_INVALID;
    try {
        toml::parse_result r = toml::parse(std::string_view(text, n), std::string_view(path));
        if (!r) { // the description quotes the text, newlines and all: ct_set_error keeps it to one line
            const toml::parse_error &e = r.error();
            return ct_fail(CT_ERR_INVALID, "%s:%d:%d: TOML syntax error: %.*s", path,
                           static_cast<int>(e.source().begin.line), static_cast<int>(e.source().begin.column),
                           static_cast<int>(e.description().size()), e.description().data());
        }
        walker w{path, max_depth, visit, ctx};
        return walk_table(w, r.table(), "", 1);
    } catch (const toml_shim::broken_check &) {
        return ct_fail(CT_ERR_INVALID, "%s: TOML syntax error: text toml++ cannot read (a [table] header or key that "
                       "starts with neither a name nor a quote?)", path);
    } catch (...) { // std::bad_alloc: nothing else throws with TOML_EXCEPTIONS 0
        return ct_fail(CT_ERR_NOMEM, "%s: out of memory", path);
    }
}
