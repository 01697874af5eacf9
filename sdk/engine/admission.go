package engine

import (
	"fmt"

	"github.com/dflash/dflash_server/sdk"
)

// capacity is a snapshot of the engine's ledger, as admission sees it.
type capacity struct {
	slots, usedSlots int
	blockSize        int
	totalBlocks      int
	freeBlocks       int
	maxCtx           int
	// headroom is the decode headroom in tokens each sequence must be able
	// to grow by.
	headroom int
	// runningNeed is the blocks running sequences still need for their
	// decode headroom beyond what they hold.
	runningNeed int
	// reclaimable is the blocks prefix-cache entries hold that admission
	// may evict; have the blocks the request brings along in the cache
	// entry it reuses.
	reclaimable int
	have        int
}

func blocksFor(tokens, blockSize int) int { return (tokens + blockSize - 1) / blockSize }

// decide answers admitted / busy / never fits for a request of prompt tokens
// that may generate maxTokens, and the blocks it must hold when admitted:
// its prompt plus the first stretch of decode headroom.
func (c capacity) decide(prompt, maxTokens int) (sdk.Admission, int) {
	need := prompt + maxTokens
	poolTokens := c.totalBlocks * c.blockSize
	adm := sdk.Admission{PromptTokens: prompt}
	switch {
	case need > c.maxCtx:
		adm.Outcome, adm.NeededTokens, adm.LimitTokens = sdk.OutcomeNeverFits, need, c.maxCtx
		adm.Reason = fmt.Sprintf("prompt (%d tokens) plus max tokens (%d) is %d tokens, more than the context of %d", prompt, maxTokens, need, c.maxCtx)
		return adm, 0
	case blocksFor(need, c.blockSize) > c.totalBlocks:
		adm.Outcome, adm.NeededTokens, adm.LimitTokens = sdk.OutcomeNeverFits, need, poolTokens
		adm.Reason = fmt.Sprintf("prompt (%d tokens) plus max tokens (%d) is %d tokens, more than the KV pool of %d", prompt, maxTokens, need, poolTokens)
		return adm, 0
	case c.usedSlots >= c.slots:
		adm.Outcome = sdk.OutcomeBusy
		adm.Reason = fmt.Sprintf("no free sequence slot (%d of %d in use)", c.usedSlots, c.slots)
		return adm, 0
	}
	promise := blocksFor(prompt+min(c.headroom, maxTokens), c.blockSize)
	if want := max(0, promise-c.have) + c.runningNeed; want > c.freeBlocks+c.reclaimable {
		adm.Outcome = sdk.OutcomeBusy
		adm.Reason = fmt.Sprintf("not enough free KV: needs %d tokens (prompt %d + decode headroom %d, plus %d for running sequences' headroom), %d free",
			want*c.blockSize, prompt, min(c.headroom, maxTokens), c.runningNeed*c.blockSize, (c.freeBlocks+c.reclaimable)*c.blockSize)
		return adm, 0
	}
	adm.Outcome = sdk.OutcomeAdmitted
	return adm, promise
}
