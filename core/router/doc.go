// Package router decides which loaded model serves a generation request and
// when. It knows nothing of HTTP: a refusal is a *Rejection with a typed
// Reason and its cause, which core/api turns into a status.
//
// It asks the routing policy for an order of candidate models, takes a
// listener reservation in core/admission, opens the backend's Start stream
// and reads its engine-level admission. Busy models are skipped, models the
// request can never fit are dropped, and when every candidate is busy the
// request waits in core/admission's bounded FIFO queue until capacity is released (or the
// periodic retry sees engine-side capacity). Nothing reaches the client
// before Start returns a Stream, so fallback always happens before response
// headers and before prefill.
//
// # Outcomes of one backend attempt
//
//   - admitted: the Stream is returned; the request stays on that model until
//     it finishes, is cancelled or fails.
//   - busy: the reservation is given back and the next candidate is tried.
//   - never fits: the model is dropped for this request; when no candidate
//     is left the request is refused (never_fits) naming the tokens needed and each
//     model's limit. Before a request first waits, the models whose backend
//     has not judged it yet are checked with Backend.CountTokens against
//     their context and KV pool, so a request that can never fit gets its
//     never_fits at once, never a queue_full or a wait.
//   - invalid: invalid_request, no fallback (the request is wrong).
//   - Start fails before its admission: when the model's Health says
//     restarting or loading, or the error is sdk.ErrUnavailable (the plugin
//     died), the model is treated as busy (the supervisor brings it back);
//     when Health says failed the model is dropped like a never-fitting one
//     (a request left with only failed models gets backend_unavailable);
//     any other error ends the request with backend_unavailable and no
//     fallback, because a backend that misbehaves for one request is not a
//     capacity signal.
//
// # Reservations
//
// A reservation is taken before Backend.Start and released only when both
// the backend's Start has returned (the engine retired the sequence) and the
// Stream was closed (output drained). A client that disconnects therefore
// never exposes capacity the engine still uses, and a slow reader keeps its
// reservation. The release of a served reservation wakes the waiters.
//
// # Policies
//
// A policy (sdk.Policy, in-process or a plugin) is called once per request.
// When it fails, panics, or names no loaded model, the router uses the
// configured block order and counts dflash_policy_errors_total; it never
// fails a request for it. With load balancing disabled the policy is not
// consulted and only the primary serves.
package router
