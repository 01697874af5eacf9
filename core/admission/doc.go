// Package admission is the core's listener-side ledger: per-model
// reservation slots and the bounded FIFO queue of requests waiting for
// capacity. It knows counts, not requests: a model is an index, a waiting
// request is a Ticket holding the indices of the models it may use.
//
// # Model
//
// A request first calls Acquire with a fresh Ticket. When no earlier waiter
// wants any of its candidate models, Acquire returns them at once and the
// caller tries them (Reserve a slot, ask the backend, Release on refusal).
// When an earlier waiter wants a candidate, that candidate is withheld: a new
// request never overtakes a waiter for the same model. A request that could
// not be admitted calls Report and Acquire again; the second Acquire puts it
// in the queue (or fails with ErrQueueFull) and blocks until it is its turn.
//
// Turns are handed out in rounds, in arrival order. A round starts when an
// admitted reservation is released, when the periodic retry fires (it
// observes engine-side capacity changes that the ledger cannot see), or when
// a request enqueues after capacity changed during its attempt. In a round
// each waiter in turn may try its candidates except the models an earlier
// waiter of the same round found busy; the round ends when every wanted model
// is busy or the queue is exhausted. One waiter attempts at a time, so the
// admitted order equals the arrival order for every model.
//
// All state lives under one mutex; every exported method keeps the
// invariants documented on Controller.
package admission
