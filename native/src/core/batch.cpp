#include "core/batch.h"

namespace dfl {

std::string check_batch_entry(const SeqTable &table, std::set<int32_t> &seen, uint32_t i, const dfl_seq_batch &sb,
                              int n_vocab) {
    const std::string who = "batch entry " + std::to_string(i) + " (sequence " + std::to_string(sb.seq) + ")";
    table.get(sb.seq);  // an unallocated sequence is reported before anything else about the entry
    if (!seen.insert(sb.seq).second) fail(DFL_ERR_INVALID, who + ": the sequence appears twice in one batch");
    if (sb.n_tokens == 0) fail(DFL_ERR_INVALID, who + ": no tokens");
    if (!sb.tokens) fail(DFL_ERR_INVALID, who + ": tokens is null");
    for (uint32_t t = 0; t < sb.n_tokens; t++)
        if (sb.tokens[t] < 0 || sb.tokens[t] >= n_vocab)
            fail(DFL_ERR_INVALID, who + ": token " + std::to_string(sb.tokens[t]) + " is outside the vocabulary (" +
                                      std::to_string(n_vocab) + ")");
    if (sb.logits > DFL_LOGITS_ALL) fail(DFL_ERR_INVALID, who + ": bad logits mode");
    return who;
}

void check_batch_blocks(const SeqTable &table, const dfl_batch &b) {
    uint64_t need = 0;
    for (uint32_t i = 0; i < b.n_seqs; i++) {
        const Seq &q = table.get(b.seqs[i].seq);
        need += table.missing_blocks(q, q.len + b.seqs[i].n_tokens);
    }
    if (need > table.free_blocks())
        fail(DFL_ERR_NO_KV, "KV pool exhausted: the batch needs " + std::to_string(need) + " more blocks, " +
                                std::to_string(table.free_blocks()) + " free");
}

}  // namespace dfl
