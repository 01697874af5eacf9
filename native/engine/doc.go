// Package engine is the Go binding of the native inference engine (native/include/dflash.h).
//
// The engine is a shared library per device kind — libdflash_cpu.so, later libdflash_cuda.so — loaded at run time
// with dlopen, so no Go build links a device runtime and a missing library is an ordinary error:
//
//	lib, err := engine.Open("bin/lib", "cpu")         // or "cuda:0": "… not found in bin/lib: this build has no cuda support"
//	m, err := lib.LoadGGUF("model.gguf", engine.Options{KVPoolTokens: 8192, MaxSeqs: 4, CacheK: "q8_0", CacheV: "q8_0"})
//	defer m.Close()
//
// LoadGGUF is LoadModel(SpecFromGGUF(f)) with the file kept mapped: weights are handed over as zero-copy views of the
// GGUF mapping; the engine never parses GGUF itself. The hyperparameters travel as the GGUF's "<arch>.*" metadata.
//
// Sequences. NewSeq gives an empty sequence slot; Forward appends tokens to sequences and returns logits; FreeSeq
// releases it. KV memory is a paged pool of fixed-size blocks shared by all sequences; KVStats reports free blocks
// and slots, and Reserve holds blocks ahead of time so a running sequence cannot hit ErrNoKV mid-generation:
//
//	s, _ := m.NewSeq()
//	res, _ := m.Forward(engine.Batch{Entries: []engine.Entry{{Seq: s, Tokens: prompt, Logits: engine.LogitsLast}}})
//	tok, _ := m.Sample(res.Row(0, 0), engine.SamplingParams{Temperature: 0.7, TopP: 0.9}, history, &rngState)
//
// A batch mixes prefill chunks and decode tokens of different sequences; every token's result is the same as if its
// sequence ran alone (CPU: bitwise). Snapshot/Rollback save and restore one sequence's length and recurrent state;
// Entry.Record plus Truncate give speculative decoding's cheap rollback inside the last forward; Batch.Capture returns
// chosen layers' hidden states (DFlash drafts).
//
// A Model serializes its calls on a lock; use one goroutine per model for throughput (batch, don't parallelize).
// Errors from the library are *Error values; test them with errors.Is against ErrNoKV, ErrNoSeq, ErrState,
// ErrInvalid, ErrUnsupported.
package engine
