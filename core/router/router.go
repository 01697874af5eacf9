package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dflash/dflash_server/core/admission"
	"github.com/dflash/dflash_server/core/health"
	"github.com/dflash/dflash_server/core/metrics"
	"github.com/dflash/dflash_server/sdk"
)

// policyTimeout bounds one policy call; a policy that hangs is a failed
// policy and the block order is used.
const policyTimeout = 2 * time.Second

// ModelInfo is static information about a loaded model for /props.
type ModelInfo struct {
	Arch        string `json:"arch"`
	Path        string `json:"file"`
	Device      string `json:"device"`
	DraftDevice string `json:"draft_device,omitempty"`
	BackendName string `json:"backend"`
}

// Model is one loaded model as the server hands it to the router. Priority
// order is slice order: primary first, then the other blocks in
// command-line order.
type Model struct {
	Name    string
	Backend sdk.Backend
	// Desc gives the capacity: MaxConcurrency (reservation slots),
	// KVPoolTokens, MaxCtx.
	Desc sdk.ModelDescription
	Info ModelInfo
	// Health reports the backend's state (loading, ready, restarting,
	// failed) and its restart count; nil means always ready. It must be
	// cheap: it is called on every attempt.
	Health func() (state health.State, restarts int)
}

func (m *Model) health() (health.State, int) {
	if m.Health == nil {
		return health.Ready, 0
	}
	return m.Health()
}

// Config configures a Router.
type Config struct {
	// QueueLimit is --routing-queue-limit: the most requests that wait;
	// 0 answers 503 at once when every candidate is busy.
	QueueLimit int
	// QueueTimeout is --routing-queue-timeout; 0 means no deadline.
	QueueTimeout time.Duration
	// AdmissionTimeout bounds the wait for a backend's first answer (admitted, busy, never fits, invalid): a backend
	// that gives none in time (a hung plugin) is passed over for the request, as a failed one is. 0 means no deadline.
	AdmissionTimeout time.Duration
	// Retry is the period of the waiters' retry; 0 means 250ms.
	Retry time.Duration
	// Policy orders candidates; nil means the block order (primary first).
	Policy     sdk.Policy
	PolicyName string
	// LoadBalancing false: only Models[0] serves and no policy is asked.
	LoadBalancing bool
	// Metrics is optional.
	Metrics *metrics.Registry
	// Logger is optional; routing decisions are logged at debug level.
	Logger hclog.Logger
}

type policyRef struct {
	p    sdk.Policy
	name string
}

// Router routes requests over the loaded models. Its methods are safe for
// concurrent use.
type Router struct {
	cfg    Config
	models []*Model
	names  []string
	index  map[string]int
	adm    *admission.Controller
	met    *metrics.Registry
	log    hclog.Logger
	policy atomic.Pointer[policyRef]
	stats  []statsCache
}

// New builds a Router over models. Bad values are clamped rather than
// refused (the launch validated them): MaxConcurrency below 1 counts as 1,
// a negative queue limit as 0.
func New(cfg Config, models []*Model) *Router {
	r := &Router{
		cfg:    cfg,
		models: models,
		names:  make([]string, len(models)),
		index:  make(map[string]int, len(models)),
		met:    cfg.Metrics,
		log:    cfg.Logger,
		stats:  make([]statsCache, len(models)),
	}
	if r.log == nil {
		r.log = hclog.NewNullLogger()
	}
	if r.cfg.QueueLimit < 0 {
		r.cfg.QueueLimit = 0
	}
	slots := make([]int, len(models))
	for i, m := range models {
		r.names[i] = m.Name
		if _, dup := r.index[m.Name]; !dup {
			r.index[m.Name] = i
		}
		slots[i] = max(m.Desc.MaxConcurrency, 1)
	}
	met := r.met
	adm, err := admission.New(admission.Config{
		Slots:        slots,
		QueueLimit:   r.cfg.QueueLimit,
		QueueTimeout: r.cfg.QueueTimeout,
		Retry:        r.cfg.Retry,
		OnQueue: func(label string, delta int) {
			met.AddWaiting(label, delta)
		},
	})
	if err != nil {
		// Unreachable with the clamping above; keep the router usable.
		panic(fmt.Sprintf("router: admission config: %v", err))
	}
	r.adm = adm
	r.SetPolicy(cfg.PolicyName, cfg.Policy)
	met.SetQueueLimit(r.cfg.QueueLimit)
	// Create every series up front so scrapers see zeros, not gaps.
	for i, m := range models {
		met.SetSlots(m.Name, 0, slots[i])
		met.AddWaiting(m.Name, 0)
		met.AddRunning(m.Name, 0)
	}
	if cfg.LoadBalancing && len(models) > 1 {
		met.AddWaiting(metrics.AnyModel, 0)
	}
	met.OnScrape(r.scrape)
	return r
}

// SetPolicy swaps the routing policy; requests already routing keep the
// order they got. A nil policy means the block order.
func (r *Router) SetPolicy(name string, p sdk.Policy) {
	if name == "" {
		name = "primary-first"
		if p != nil {
			name = "custom"
		}
	}
	r.policy.Store(&policyRef{p: p, name: name})
}

// Start routes one request (see the package comment). Nothing is written
// to the client before it returns. The returned Stream must be closed.
func (r *Router) Start(ctx context.Context, req *sdk.ChatRequest) (*Stream, error) {
	if req == nil {
		return nil, r.refuse(metrics.AnyModel, rejection(ReasonInvalidRequest, nil, "no request"))
	}
	if len(r.models) == 0 {
		return nil, r.refuse(metrics.AnyModel, rejection(ReasonBackendUnavailable, nil, "no model is loaded"))
	}
	if r.adm.Closed() {
		return nil, r.refuse(metrics.AnyModel, rejection(ReasonShuttingDown, admission.ErrShuttingDown, "server is shutting down"))
	}
	order, pin, rej := r.plan(ctx, req)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if rej != nil {
		return nil, r.refuse(metrics.AnyModel, rej)
	}
	label := metrics.AnyModel
	if len(order) == 1 {
		label = r.names[order[0]]
	}
	rt := routing{r: r, req: req, order: order, pin: pin, label: label}
	rt.skipped = make([]string, len(r.models))
	rt.judged = make([]bool, len(r.models))
	rt.ticket = r.adm.NewTicket(append(make([]int, 0, len(order)), order...), label)
	s, err := rt.run(ctx)
	if err != nil {
		r.adm.Leave(rt.ticket)
		var rj *Rejection
		if errors.As(err, &rj) {
			r.refuse(label, rj)
		}
		return nil, err
	}
	return s, nil
}

func (r *Router) refuse(label string, rj *Rejection) *Rejection {
	r.met.Rejection(label, string(rj.Reason))
	r.log.Debug("request refused", "reason", rj.Reason, "message", rj.Message)
	return rj
}

// routing is one request's state while it looks for a model.
type routing struct {
	r       *Router
	req     *sdk.ChatRequest
	order   []int
	pin     bool
	label   string
	ticket  *admission.Ticket
	skipped []string // last reason each model was passed over
	judged  []bool   // the model's backend answered busy or never fits
	busy    []int
	drop    []int
	never   []string // never-fits explanations
	failed  int      // models dropped because their backend failed
}

func (rt *routing) run(ctx context.Context) (*Stream, error) {
	r := rt.r
	attempted, checked := false, false
	for {
		// Before the request first waits, make sure it can fit somewhere.
		if !checked && (attempted || r.adm.WouldQueue(rt.ticket)) {
			checked = true
			if err := rt.precheck(ctx); err != nil {
				return nil, err
			}
		}
		attempted = true
		allowed, err := r.adm.Acquire(ctx, rt.ticket)
		if err != nil {
			return nil, rt.waitError(ctx, err)
		}
		rt.busy, rt.drop = rt.busy[:0], rt.drop[:0]
		for _, m := range allowed {
			s, err := rt.try(ctx, m)
			if err != nil || s != nil {
				return s, err
			}
		}
		if left := r.adm.Report(rt.ticket, rt.busy, rt.drop); left == 0 {
			if rt.failed > 0 {
				return nil, rejection(ReasonBackendUnavailable, nil,
					"no model that could serve this request is available: %s", strings.Join(rt.never, "; "))
			}
			return nil, rejection(ReasonNeverFits, nil,
				"the request does not fit any loaded model: %s", strings.Join(rt.never, "; "))
		}
	}
}

// precheck runs before a request first waits: for each candidate whose
// backend has not yet judged the request, it counts the prompt with that
// model's template (Backend.CountTokens) and applies the sdk's never-fits
// rule, prompt plus output budget against the context and the KV pool, so
// a request that can never fit gets its 400 now instead of a 503 or a
// wait. The budget it assumes is never larger than the backend's (see
// outputBudget); anything uncertain (no limits known, a counting error) is
// left to the backend's admission.
func (rt *routing) precheck(ctx context.Context) error {
	r := rt.r
	rt.drop = rt.drop[:0]
	for _, m := range rt.order {
		if rt.judged[m] {
			continue
		}
		model := r.models[m]
		limit := fitLimit(model.Desc)
		if limit <= 0 {
			continue
		}
		if st, _ := model.health(); st != health.Ready {
			continue
		}
		n, err := model.Backend.CountTokens(ctx, rt.req)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		}
		budget := outputBudget(rt.req, model.Desc)
		if need := n + budget; need > limit || n >= limit {
			rt.drop = append(rt.drop, m)
			rt.skipped[m] = skipNeverFits
			rt.never = append(rt.never, fmt.Sprintf("%s: needs %d tokens, limit %d (prompt %d, max tokens %d)", model.Name, need, limit, n, budget))
		}
	}
	if len(rt.drop) > 0 && r.adm.Report(rt.ticket, nil, rt.drop) == 0 {
		return rejection(ReasonNeverFits, nil,
			"the request does not fit any loaded model: %s", strings.Join(rt.never, "; "))
	}
	return nil
}

// outputBudget is the request's output budget as the sdk defines it: its
// MaxTokens, else the model's DefaultMaxTokens, clamped to the model's
// MaxTokens; 0 when unknown.
func outputBudget(req *sdk.ChatRequest, d sdk.ModelDescription) int {
	n := req.MaxTokens
	if n <= 0 {
		n = d.DefaultMaxTokens
	}
	if d.MaxTokens > 0 && n > d.MaxTokens {
		n = d.MaxTokens
	}
	return max(n, 0)
}

// fitLimit is the smaller positive one of the model's context and KV pool.
func fitLimit(d sdk.ModelDescription) int {
	switch {
	case d.MaxCtx > 0 && d.KVPoolTokens > 0:
		return min(d.MaxCtx, d.KVPoolTokens)
	case d.MaxCtx > 0:
		return d.MaxCtx
	}
	return d.KVPoolTokens
}

func (rt *routing) waitError(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, admission.ErrQueueFull):
		if rt.r.cfg.QueueLimit == 0 {
			return rejection(ReasonQueueFull, err, "every model that can serve this request is busy and queueing is disabled")
		}
		return rejection(ReasonQueueFull, err, "every model that can serve this request is busy and %d requests are already waiting", rt.r.cfg.QueueLimit)
	case errors.Is(err, admission.ErrQueueTimeout):
		return rejection(ReasonQueueTimeout, err, "no model became free within %s", rt.r.cfg.QueueTimeout)
	case errors.Is(err, admission.ErrShuttingDown):
		return rejection(ReasonShuttingDown, err, "server is shutting down")
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return err
}

const (
	skipBusy        = "busy"
	skipNeverFits   = "never_fits"
	skipUnavailable = "unavailable"
)

// try makes one attempt on model m. It returns a Stream when admitted, an
// error when the request ends here, or neither when the request goes on
// (m recorded as busy or dropped).
func (rt *routing) try(ctx context.Context, m int) (*Stream, error) {
	r := rt.r
	model := r.models[m]
	switch st, _ := model.health(); st {
	case health.Ready:
	case health.Failed:
		rt.dropFailed(m, "backend failed")
		return nil, nil
	default:
		rt.markBusy(m, skipUnavailable)
		return nil, nil
	}
	if err := r.adm.Reserve(m); err != nil {
		if errors.Is(err, admission.ErrShuttingDown) {
			return nil, rejection(ReasonShuttingDown, err, "server is shutting down")
		}
		rt.markBusy(m, skipBusy)
		return nil, nil
	}
	s := newStream(ctx, r, m)
	go s.run(rt.req)
	a, startErr, done := s.awaitAdmission(ctx, r.cfg.AdmissionTimeout)
	if !done {
		s.Close()
		return nil, ctx.Err()
	}
	if startErr != nil {
		s.Close()
		return nil, rt.startFailed(ctx, m, startErr)
	}
	switch a.Outcome {
	case sdk.OutcomeAdmitted:
		return rt.admitted(s, m, a), nil
	case sdk.OutcomeBusy:
		s.Close()
		rt.markBusy(m, skipBusy)
		rt.judged[m] = true
		return nil, nil
	case sdk.OutcomeNeverFits:
		s.Close()
		rt.judged[m] = true
		rt.drop = append(rt.drop, m)
		rt.skipped[m] = skipNeverFits
		rt.never = append(rt.never, neverFitsText(model.Name, a))
		return nil, nil
	case sdk.OutcomeInvalid:
		s.Close()
		reason := a.Reason
		if reason == "" {
			reason = "the request is not valid for this model"
		}
		return nil, rejection(ReasonInvalidRequest, nil, "%s: %s", model.Name, reason)
	}
	s.Close()
	return nil, rejection(ReasonBackendUnavailable, nil, "%s: unknown admission outcome %d", model.Name, a.Outcome)
}

func (rt *routing) markBusy(m int, why string) {
	rt.busy = append(rt.busy, m)
	rt.skipped[m] = why
}

func (rt *routing) dropFailed(m int, why string) {
	rt.drop = append(rt.drop, m)
	rt.skipped[m] = skipUnavailable
	rt.failed++
	rt.never = append(rt.never, rt.r.names[m]+": "+why)
}

func (rt *routing) startFailed(ctx context.Context, m int, err error) error {
	model := rt.r.models[m]
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var inv *sdk.InvalidError
	if errors.As(err, &inv) {
		return rejection(ReasonInvalidRequest, err, "%s: %s", model.Name, inv.Msg)
	}
	if errors.Is(err, errNoAdmission) {
		rt.r.log.Warn("backend gave no admission in time", "model", model.Name, "timeout", rt.r.cfg.AdmissionTimeout)
		rt.dropFailed(m, err.Error())
		return nil
	}
	switch st, _ := model.health(); {
	case st == health.Failed:
		rt.dropFailed(m, "backend failed: "+err.Error())
		return nil
	case st != health.Ready || errors.Is(err, sdk.ErrUnavailable):
		rt.markBusy(m, skipUnavailable)
		return nil
	}
	rt.r.log.Warn("backend start failed", "model", model.Name, "err", err)
	return rejection(ReasonBackendUnavailable, err, "%s: %v", model.Name, err)
}

func neverFitsText(name string, a sdk.Admission) string {
	var b strings.Builder
	b.WriteString(name)
	b.WriteString(": ")
	if a.NeededTokens > 0 || a.LimitTokens > 0 {
		fmt.Fprintf(&b, "needs %d tokens, limit %d", a.NeededTokens, a.LimitTokens)
		if a.PromptTokens > 0 {
			fmt.Fprintf(&b, " (prompt %d)", a.PromptTokens)
		}
		if a.Reason != "" {
			b.WriteString(" - " + a.Reason)
		}
		return b.String()
	}
	if a.Reason != "" {
		b.WriteString(a.Reason)
	} else {
		b.WriteString("does not fit")
	}
	return b.String()
}

func (rt *routing) admitted(s *Stream, m int, a sdk.Admission) *Stream {
	r := rt.r
	now := time.Now()
	s.adm = a
	if q := rt.ticket.QueuedAt(); !q.IsZero() {
		s.queueWait = now.Sub(q)
	}
	r.adm.Leave(rt.ticket)
	first := rt.order[0]
	switch {
	case m == first && m == 0:
		s.route = "primary"
	case m == first && rt.pin:
		s.route = "pinned"
	case m == first:
		s.route = "policy"
	default:
		var b strings.Builder
		b.WriteString("fallback:")
		n := 0
		for _, o := range rt.order {
			if o == m {
				break
			}
			if n > 0 {
				b.WriteByte(',')
			}
			why := rt.skipped[o]
			if why == "" {
				why = skipBusy
			}
			b.WriteString(r.names[o] + "=" + why)
			n++
		}
		s.route = b.String()
		r.met.Fallback(r.names[first], r.names[m])
	}
	r.met.ObserveQueueWait(r.names[m], s.queueWait)
	r.log.Debug("request admitted", "id", rt.req.ID, "model", r.names[m], "route", s.route, "queue_wait", s.queueWait, "prompt_tokens", a.PromptTokens)
	return s
}

// plan asks the policy for the candidate order.
func (r *Router) plan(ctx context.Context, req *sdk.ChatRequest) ([]int, bool, *Rejection) {
	if !r.cfg.LoadBalancing || len(r.models) == 1 {
		return []int{0}, false, nil
	}
	ref := r.policy.Load()
	if ref.p == nil {
		return r.blockOrder(), false, nil
	}
	dec, err := r.callPolicy(ctx, ref.p, r.snapshot(req))
	if err != nil {
		if ctx.Err() != nil {
			return nil, false, nil // the client left; Start reports it
		}
		r.met.PolicyError(ref.name)
		r.log.Warn("routing policy failed; using the block order", "policy", ref.name, "err", err)
		return r.blockOrder(), false, nil
	}
	if dec.NotFound {
		msg := dec.Message
		if msg == "" {
			msg = fmt.Sprintf("model %q is not loaded; loaded models: %s", req.Model, strings.Join(r.names, ", "))
		}
		return nil, false, rejection(ReasonUnknownModel, ErrUnknownModel, "%s", msg)
	}
	order := make([]int, 0, len(dec.Order))
	for _, name := range dec.Order {
		i, ok := r.index[name]
		if !ok || contains(order, i) {
			continue
		}
		order = append(order, i)
	}
	if len(order) == 0 {
		r.met.PolicyError(ref.name)
		r.log.Warn("routing policy named no loaded model; using the block order", "policy", ref.name, "order", dec.Order)
		return r.blockOrder(), false, nil
	}
	if dec.Pin {
		order = order[:1]
	}
	return order, dec.Pin, nil
}

func (r *Router) callPolicy(ctx context.Context, p sdk.Policy, snap sdk.Snapshot) (dec sdk.Decision, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("policy panicked: %v", v)
		}
	}()
	pctx, cancel := context.WithTimeout(ctx, policyTimeout)
	defer cancel()
	return p.Order(pctx, snap)
}

func (r *Router) blockOrder() []int {
	order := make([]int, len(r.models))
	for i := range order {
		order[i] = i
	}
	return order
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// snapshot is the state the policy sees for req.
func (r *Router) snapshot(req *sdk.ChatRequest) sdk.Snapshot {
	var c admission.Counts
	r.adm.Counts(&c)
	snap := sdk.Snapshot{RequestedModel: req.Model, Waiting: c.Waiting, Models: make([]sdk.ModelState, len(r.models))}
	for i, m := range r.models {
		st, _ := m.health()
		kvUsed, _ := r.stats[i].kv()
		snap.Models[i] = sdk.ModelState{
			Name:         m.Name,
			Primary:      i == 0,
			Available:    st == health.Ready,
			Slots:        c.Slots[i],
			InFlight:     c.InUse[i],
			KVPoolTokens: m.Desc.KVPoolTokens,
			KVTokensUsed: kvUsed,
			MaxCtx:       m.Desc.MaxCtx,
			Fits:         true,
		}
	}
	return snap
}

// Wake makes waiting requests retry now instead of at the next periodic
// retry; the server calls it when a backend becomes ready again.
func (r *Router) Wake() { r.adm.Retry() }

// Quiesce starts the drain: new requests and every waiter get 503
// shutting_down; streams already admitted go on.
func (r *Router) Quiesce() { r.adm.Quiesce() }

// Wait blocks until no reservation is held (every admitted stream finished
// and was closed) or ctx ends.
func (r *Router) Wait(ctx context.Context) error { return r.adm.Wait(ctx) }
