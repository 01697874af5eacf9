// Package engine is the Go runtime a native backend runs on top of its model:
// sequences, a continuous-batching step loop that mixes prefill chunks with
// decode, sampling through the model, stop conditions (end-of-generation
// tokens, stop strings across token boundaries, max tokens, reasoning
// budgets), incremental detokenization and output parsing, and the atomic
// admission the core's routing relies on.
//
// A request can hold its visible text to a format (FormatJSONObject, for
// response_format json_object): the sampled token is checked against an
// incremental JSON validator (package jsonprefix) and thrown away when it
// does not fit, a few times, after which every misfit of the vocabulary is
// masked and the sampler draws from what is left. Unconstrained requests
// take the plain path. Reasoning sections are not constrained: the format
// applies from where the answer starts.
//
// The engine never touches a device itself: it drives a Model (defined here,
// implemented by a backend's binding to its native library, or by the fake
// in package enginetest), so it is testable without cgo.
//
// Admission is decided by the engine's own ledger of KV blocks and sequence
// slots, under one lock, when Run is called: a request is admitted when a
// slot is free and the free KV blocks cover its prompt plus decode headroom
// and the decode headroom of every running sequence; it never fits when its
// prompt plus max tokens exceeds the context or the whole KV pool. Running
// sequences grow their KV reservation block by block as they decode; one
// that finds the pool exhausted ends with an error and frees its blocks.
//
// An optional prefix cache (Config.PrefixCacheSlots) keeps finished
// sequences with their KV; a later prompt that starts the same way adopts
// the longest matching one and prefills only the rest. Models with
// recurrent state can only go back to a snapshot, taken where the request's
// generation prompt starts (Request.SnapshotAt), which is what the next
// turn of a conversation shares. Cached KV counts as free for admission and
// is evicted, oldest first, when admission or a running sequence needs it.
//
// The step loop runs in one goroutine and is the only caller of the Model.
// It never blocks on a consumer: each request's events go to a bounded
// per-request outbox drained by Run's own goroutine; a sequence whose outbox
// is full is left out of the batch until its consumer catches up.
package engine
