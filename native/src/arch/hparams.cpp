#include "arch/hparams.h"

namespace dfl {

MetaMap meta_map(const dfl_model_params &p) {
    MetaMap m;
    for (uint32_t i = 0; i < p.n_meta; i++) {
        if (!p.meta[i].key) fail(DFL_ERR_INVALID, "metadata entry " + std::to_string(i) + " has no key");
        m[p.meta[i].key] = &p.meta[i];
    }
    return m;
}

const dfl_meta *meta_find(const MetaMap &m, const std::string &key) {
    auto it = m.find(key);
    return it == m.end() ? nullptr : it->second;
}

double meta_number(const dfl_meta *m, const std::string &key, double def) {
    if (!m) return def;
    if (m->kind == DFL_META_FLOAT) return m->f;
    if (m->kind == DFL_META_INT) return (double)m->i;
    fail(DFL_ERR_INVALID, "metadata " + key + " is not a number");
}

int positive_hparam(int64_t v, const std::string &name) {
    if (v <= 0 || v > (1 << 30)) fail(DFL_ERR_INVALID, "model hyperparameter " + name + " = " + std::to_string(v) + " is out of range");
    return (int)v;
}

}  // namespace dfl
