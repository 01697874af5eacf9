// Package api is the HTTP face of dflash_server: it decodes OpenAI Chat
// Completions, Anthropic Messages and OpenAI Responses requests into one
// neutral sdk.ChatRequest, hands it to the router, and writes the router's
// event stream back in the shape (JSON body or SSE events) of the API the
// client spoke. It also serves the token utilities (/tokenize, /detokenize,
// /v1/messages/count_tokens) and the observability endpoints (/v1/models,
// /health, /ready, /props, /status/json, /metrics).
//
// The package knows HTTP and nothing of models: every decision about which
// model serves a request, and whether it has to wait, belongs to the router.
// Nothing is written to a client before the router has admitted its request,
// so every refusal is still an HTTP status with an error body in the API's
// own shape; failures after that are sent as the API's in-stream error event.
package api
