// Package primaryfirst is the primary-first routing policy: the operator's
// primary first, then the other loaded models in block order, skipping
// models the core knows the request can never fit. The request's model
// field is ignored. It is importable so the core's tests and benchmarks can
// run it in-process; the plugin binary serves it over gRPC.
package primaryfirst
