package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/julienschmidt/httprouter"

	"github.com/dflash/dflash_server/core/router"
	"github.com/dflash/dflash_server/sdk"
)

// Stream is one admitted request as the router hands it over;
// *router.Stream satisfies it.
type Stream interface {
	// Model is the model that admitted the request; responses name it.
	Model() string
	// Admission is the backend's admission answer (prompt tokens).
	Admission() sdk.Admission
	// Route says how the model was chosen (X-Dflash-Route).
	Route() string
	// QueueWait is how long the request waited for a slot.
	QueueWait() time.Duration
	// Recv returns the next event; io.EOF after the finish event; ctx's
	// error once ctx is done; any other error is a failure after admission.
	Recv(ctx context.Context) (sdk.Event, error)
	// Close ends the request and releases its reservation; idempotent.
	Close()
}

// Router is what the HTTP layer needs from the router; FromRouter adapts
// core/router's *Router to it. Its methods are called concurrently.
type Router interface {
	// Start routes one request; nothing is written before it returns.
	// Refusals are *router.Rejection errors.
	Start(ctx context.Context, req *sdk.ChatRequest) (Stream, error)
	Tokenize(ctx context.Context, model, text string, addSpecial bool) (string, []int32, error)
	Detokenize(ctx context.Context, model string, ids []int32) (string, string, error)
	CountTokens(ctx context.Context, req *sdk.ChatRequest) (string, int, error)
	// Models lists the loaded models in priority order; each must marshal
	// to a JSON object with a "name" field.
	Models() []any
	// Status is the JSON of /props and /status/json.
	Status() any
}

// FromRouter adapts core/router's *Router to Router.
func FromRouter(r *router.Router) Router { return routerAdapter{r} }

type routerAdapter struct{ *router.Router }

func (a routerAdapter) Start(ctx context.Context, req *sdk.ChatRequest) (Stream, error) {
	s, err := a.Router.Start(ctx, req)
	if err != nil {
		return nil, err // never a typed nil inside the interface
	}
	return s, nil
}

func (a routerAdapter) Models() []any {
	ms := a.Router.Models()
	out := make([]any, len(ms))
	for i, m := range ms {
		out[i] = m
	}
	return out
}

func (a routerAdapter) Status() any { return a.Router.Status() }

// Options configure a Server; the zero value serves without auth or CORS
// with the default limits.
type Options struct {
	// Ready reports readiness for /ready: ok false answers 503 with state
	// ("loading", "draining", ...) as the status. Nil means always ready.
	Ready func() (ok bool, state string)
	// Metrics serves /metrics; nil answers 404.
	Metrics http.Handler
	// APIKeys, when not empty, are required on every route as
	// "Authorization: Bearer <key>" or "x-api-key: <key>", except
	// /health, /livez, /ready, /readyz and CORS preflights.
	APIKeys []string
	// ProtectInfo also requires a key on /metrics, /props, /status/json.
	ProtectInfo bool
	// CORSOrigins lists the origins allowed to call from a browser; "*"
	// allows any. Empty sends no CORS headers.
	CORSOrigins []string
	// MaxBodyBytes bounds a request body (413 above). Default 32 MiB.
	MaxBodyBytes int64
	// BodyTimeout bounds the time a client may take to send a request body
	// once its headers arrived (408 after it), so a client that trickles a
	// body cannot hold a connection for ever. Default 60s; negative
	// disables.
	BodyTimeout time.Duration
	// MaxJSONDepth bounds object/array nesting of a body. Default 64.
	MaxJSONDepth int
	// MaxMessages bounds messages / input items per request. Default 4096.
	MaxMessages int
	// MaxTokens bounds max_tokens and its equivalents. Default 1048576.
	MaxTokens int
	// OverloadStatus is the status of a queue_full / queue_timeout refusal:
	// 0 or 503 keeps 503; 429 sheds with 429 on every route; 529 answers
	// 529 on Anthropic routes (OpenAI routes keep 503).
	OverloadStatus int
	// Heartbeat is the keep-alive interval of a quiet SSE stream (a comment,
	// or Anthropic's ping event). Default 10s; negative disables.
	Heartbeat time.Duration
	// Logger receives handler panics; nil uses hclog.Default().
	Logger hclog.Logger
	// OwnedBy is the owned_by of /v1/models entries. Default "dflash_server".
	OwnedBy string
	// ObserveRequest, when set, is told the outcome of every generation
	// request: the model that answered ("" when none did), the API
	// ("chat", "messages", "responses"), the status (499 when
	// the client left) and the duration.
	ObserveRequest func(model, api string, code int, d time.Duration)
}

// Server serves the HTTP API. It is an http.Handler.
type Server struct {
	rt      Router
	opts    Options
	lim     limits
	handler http.Handler
	keys    [][sha256.Size]byte // digests of the accepted API keys
	// now and newID are replaced by tests for stable output.
	now     func() time.Time
	newID   func(prefix string) string
	created int64
}

// New builds the HTTP API over r.
func New(r Router, opts Options) *Server {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 32 << 20
	}
	if opts.BodyTimeout == 0 {
		opts.BodyTimeout = time.Minute
	}
	if opts.MaxJSONDepth <= 0 {
		opts.MaxJSONDepth = 64
	}
	if opts.MaxMessages <= 0 {
		opts.MaxMessages = 4096
	}
	if opts.MaxTokens <= 0 {
		opts.MaxTokens = 1 << 20
	}
	if opts.Heartbeat == 0 {
		opts.Heartbeat = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = hclog.Default()
	}
	if opts.OwnedBy == "" {
		opts.OwnedBy = "dflash_server"
	}
	s := &Server{
		rt:    r,
		opts:  opts,
		lim:   limits{maxBody: opts.MaxBodyBytes, bodyTimeout: opts.BodyTimeout, maxDepth: opts.MaxJSONDepth, maxMessages: opts.MaxMessages, maxTokens: opts.MaxTokens},
		now:   time.Now,
		newID: randomID,
	}
	s.created = s.now().Unix()
	for _, k := range opts.APIKeys {
		if k != "" {
			s.keys = append(s.keys, sha256.Sum256([]byte(k)))
		}
	}
	s.handler = s.routes()
	return s
}

func (s *Server) routes() http.Handler {
	hr := httprouter.New()
	post := func(path string, h http.HandlerFunc) { hr.Handler(http.MethodPost, path, h) }
	get := func(path string, h http.HandlerFunc) { hr.Handler(http.MethodGet, path, h) }
	post("/v1/chat/completions", s.handleChat)
	post("/chat/completions", s.handleChat)
	post("/v1/completions", s.handleCompletions)
	post("/completions", s.handleCompletions)
	post("/v1/messages", s.handleMessages)
	post("/v1/messages/count_tokens", s.handleCountTokens)
	post("/v1/responses", s.handleResponses)
	post("/tokenize", s.handleTokenize)
	post("/detokenize", s.handleDetokenize)
	get("/v1/models", s.handleModels)
	get("/v1/models/*id", s.handleModel)
	get("/models", s.handleModels)
	get("/health", s.handleHealth)
	get("/livez", s.handleHealth)
	get("/ready", s.handleReady)
	get("/readyz", s.handleReady)
	get("/props", s.handleStatus)
	get("/status/json", s.handleStatus)
	get("/metrics", s.handleMetrics)
	hr.NotFound = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, &apiError{status: http.StatusNotFound, code: "not_found", message: "no route for " + r.Method + " " + r.URL.Path})
	})
	hr.MethodNotAllowed = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, &apiError{status: http.StatusMethodNotAllowed, kind: "invalid_request_error", code: "method_not_allowed",
			message: r.Method + " is not allowed on " + r.URL.Path})
	})
	// Preflights are answered by the CORS layer before routing.
	hr.HandleOPTIONS = false
	hr.PanicHandler = s.recoverPanic
	return hr
}

// ServeHTTP adds the request id, CORS and auth, then routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := s.newID("req_")
	h := w.Header()
	h.Set("X-Request-Id", id)
	if shapeOf(r.URL.Path) == shapeAnthropic {
		h.Set("request-id", id)
	}
	r = r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id))
	if s.cors(w, r) {
		return
	}
	if len(s.keys) > 0 && s.needsKey(r.URL.Path) && !s.validKey(r) {
		h.Set("WWW-Authenticate", `Bearer realm="dflash_server"`)
		s.fail(w, r, &apiError{status: http.StatusUnauthorized, code: "invalid_api_key",
			message: "missing or invalid API key: send Authorization: Bearer <key> or x-api-key: <key>"})
		return
	}
	w = &trackingWriter{ResponseWriter: w}
	s.handler.ServeHTTP(w, r)
}

type requestIDKey struct{}

func requestID(r *http.Request) string {
	id, _ := r.Context().Value(requestIDKey{}).(string)
	return id
}

// fail answers e in the shape of r's route.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, e *apiError) {
	writeError(w, shapeOf(r.URL.Path), requestID(r), e)
}

// openPaths never need an API key: probes must work without secrets.
var openPaths = map[string]bool{"/health": true, "/livez": true, "/ready": true, "/readyz": true}

var infoPaths = map[string]bool{"/metrics": true, "/props": true, "/status/json": true}

func (s *Server) needsKey(path string) bool {
	if openPaths[path] {
		return false
	}
	if infoPaths[path] {
		return s.opts.ProtectInfo
	}
	return true
}

func (s *Server) validKey(r *http.Request) bool {
	var got string
	if a := r.Header.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		got = strings.TrimSpace(a[7:])
	} else {
		got = r.Header.Get("X-Api-Key")
	}
	if got == "" {
		return false
	}
	// Digests have one length, so the comparison does not end early on a
	// length mismatch (subtle.ConstantTimeCompare does, which would time
	// out a key's length); every key is compared, so timing does not tell
	// which one matched either.
	d := sha256.Sum256([]byte(got))
	ok := 0
	for i := range s.keys {
		ok |= subtle.ConstantTimeCompare(d[:], s.keys[i][:])
	}
	return ok == 1
}

// exposedHeaders are the response headers a browser client may read.
const exposedHeaders = "X-Request-Id, request-id, X-Dflash-Model, X-Dflash-Route, X-Dflash-Queue-Ms, X-Dflash-Reject-Reason, Retry-After"

// cors adds CORS headers for an allowed origin and answers preflights; it
// reports whether the request was fully answered.
func (s *Server) cors(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" || len(s.opts.CORSOrigins) == 0 {
		return false
	}
	h := w.Header()
	h.Add("Vary", "Origin")
	allowed := slices.Contains(s.opts.CORSOrigins, origin)
	if !allowed && slices.Contains(s.opts.CORSOrigins, "*") {
		allowed = true
	}
	preflight := r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != ""
	if !allowed {
		if preflight {
			w.WriteHeader(http.StatusForbidden)
			return true
		}
		return false
	}
	h.Set("Access-Control-Allow-Origin", origin)
	if !preflight {
		h.Set("Access-Control-Expose-Headers", exposedHeaders)
		return false
	}
	h.Add("Vary", "Access-Control-Request-Method")
	h.Add("Vary", "Access-Control-Request-Headers")
	h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
	if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
		// The SDKs send many x-stainless-* and anthropic-* headers; echoing
		// the request is simpler and no less safe than a fixed list.
		h.Set("Access-Control-Allow-Headers", req)
	}
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
	return true
}

// trackingWriter remembers whether the response has started, so a panic
// after the first byte is not answered with a second status.
type trackingWriter struct {
	http.ResponseWriter
	started bool
}

func (t *trackingWriter) WriteHeader(code int) {
	t.started = true
	t.ResponseWriter.WriteHeader(code)
}

func (t *trackingWriter) Write(b []byte) (int, error) {
	t.started = true
	return t.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush on the real writer.
func (t *trackingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

func (s *Server) recoverPanic(w http.ResponseWriter, r *http.Request, v any) {
	if v == http.ErrAbortHandler {
		panic(v)
	}
	s.opts.Logger.Error("api handler panic", "method", r.Method, "path", r.URL.Path, "request_id", requestID(r), "panic", v)
	if t, ok := w.(*trackingWriter); ok && t.started {
		// Headers are gone; dropping the connection is the only honest end.
		panic(http.ErrAbortHandler)
	}
	s.fail(w, r, internalError("internal error while handling the request (request id %s)", requestID(r)))
}

// randomID returns prefix followed by 24 random hex digits.
func randomID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
