package nativebackend

import (
	"fmt"

	native "github.com/dflash/dflash_server/native/engine"
)

// memoryHeadroom is the part of a GPU's free memory left unused when the KV pool is sized from it: the CUDA context,
// cuBLAS workspaces and graphs grow after load.
const memoryHeadroom = 0.05

// fitPool sizes the KV pool, in tokens, of a model on a device with free bytes: every sequence's full context
// (want, slots × max-ctx) when it fits next to the weights, the recurrent state of seqs slots, the verify records and
// the activations; less when it does not, but never less than one full context (minimum). The error names the bytes
// asked and free.
func fitPool(est native.Estimate, free uint64, seqs int, records uint64, want, minimum int) (int, error) {
	fixed := est.WeightBytes + est.ScratchBytes + uint64(seqs)*est.StateBytesPerSeq + records
	usable := uint64(float64(free) * (1 - memoryHeadroom))
	need := fixed + uint64(minimum)*est.KVBytesPerToken
	if usable < need {
		return 0, fmt.Errorf("does not fit: it needs %d bytes (weights %d, activations %d, recurrent state %d, verify records %d, KV for %d tokens %d) and %d bytes are free",
			need, est.WeightBytes, est.ScratchBytes, uint64(seqs)*est.StateBytesPerSeq, records, minimum, uint64(minimum)*est.KVBytesPerToken, free)
	}
	if est.KVBytesPerToken == 0 {
		return want, nil
	}
	return int(min(uint64(want), (usable-fixed)/est.KVBytesPerToken)), nil
}

// recordBytes is what the engine allocates, when speculative decoding first verifies, for slots sequences that verify
// rows tokens at a time (a tree when tree).
func recordBytes(est native.Estimate, slots, rows int, tree bool) uint64 {
	return uint64(slots) * est.RecordBytes(rows, tree)
}

// devicePool is the KV pool of a model on a GPU when the operator gave no --kv-pool-tokens: what fitPool allows
// with the device's free memory now, for seqs sequence slots of which slots verify up to rows tokens a step (trees
// when tree).
func devicePool(lib *native.Lib, ms native.ModelSpec, seqs, slots, rows int, tree bool, want, minimum int) (int, error) {
	est, err := lib.Estimate(ms)
	if err != nil {
		return 0, err
	}
	free, _, err := lib.Memory()
	if err != nil {
		return 0, err
	}
	n, err := fitPool(est, free, seqs, recordBytes(est, slots, rows, tree), want, minimum)
	if err != nil {
		return 0, fmt.Errorf("%s:%d: %w", lib.Kind(), lib.Device(), err)
	}
	return n, nil
}
