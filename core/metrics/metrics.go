package metrics

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// AnyModel is the model label of a waiting request that any of several
// models may serve.
const AnyModel = "any"

// Options select optional series.
type Options struct {
	// VLLMCompat also exports vllm:num_requests_waiting,
	// vllm:num_requests_running and vllm:kv_cache_usage_perc (label
	// model_name), the names gateways scrape by default.
	VLLMCompat bool
	// ProcessCollectors adds the Go runtime and process collectors.
	ProcessCollectors bool
}

// Registry is the server's metric set. Create it with New; the zero value
// and a nil *Registry record nothing.
type Registry struct {
	reg *prometheus.Registry

	waiting       *prometheus.GaugeVec
	running       *prometheus.GaugeVec
	kvUsage       *prometheus.GaugeVec
	kvUsed        *prometheus.GaugeVec
	kvCapacity    *prometheus.GaugeVec
	slotsInUse    *prometheus.GaugeVec
	slotsTotal    *prometheus.GaugeVec
	queueLimit    prometheus.Gauge
	fallbacks     *prometheus.CounterVec
	rejections    *prometheus.CounterVec
	policyErrors  *prometheus.CounterVec
	queueWait     *prometheus.HistogramVec
	ttft          *prometheus.HistogramVec
	tpot          *prometheus.HistogramVec
	itl           *prometheus.HistogramVec
	promptTokens  *prometheus.CounterVec
	genTokens     *prometheus.CounterVec
	draftProposed *prometheus.CounterVec
	draftAccepted *prometheus.CounterVec
	draftSteps    *prometheus.CounterVec
	requests      *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	backendUp     *prometheus.GaugeVec

	compatWaiting *prometheus.GaugeVec
	compatRunning *prometheus.GaugeVec
	compatKV      *prometheus.GaugeVec

	mu       sync.Mutex
	restarts map[string]float64 // model → backend restarts, set by the server
	hooks    []func()
}

// Buckets in seconds. TTFT spans sub-millisecond cache hits to long
// prefills; TPOT covers fast speculative decoding up to slow CPU decoding.
var (
	queueBuckets = []float64{0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	ttftBuckets  = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640}
	tpotBuckets  = []float64{0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5}
	durBuckets   = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800}
)

// New returns a registry with every series registered.
func New(opts Options) *Registry {
	r := &Registry{reg: prometheus.NewRegistry(), restarts: map[string]float64{}}
	model := []string{"model"}
	gauge := func(name, help string, labels []string) *prometheus.GaugeVec {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
		r.reg.MustRegister(g)
		return g
	}
	counter := func(name, help string, labels []string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		r.reg.MustRegister(c)
		return c
	}
	hist := func(name, help string, buckets []float64, labels []string) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
		r.reg.MustRegister(h)
		return h
	}

	r.waiting = gauge("dflash_requests_waiting", "Requests waiting in the routing queue, by the model they wait for (\"any\" when several may serve them).", model)
	r.running = gauge("dflash_requests_running", "Requests admitted by a model and not yet released.", model)
	r.kvUsage = gauge("dflash_kv_cache_usage_ratio", "Fraction of the model's KV pool in use (0-1).", model)
	r.kvUsed = gauge("dflash_kv_tokens_reserved", "KV tokens in use by the model's engine.", model)
	r.kvCapacity = gauge("dflash_kv_tokens_capacity", "KV pool size of the model in tokens.", model)
	r.slotsInUse = gauge("dflash_slots_in_use", "Listener reservations held on the model.", model)
	r.slotsTotal = gauge("dflash_slots_total", "Listener reservation slots of the model (max concurrency).", model)
	r.queueLimit = prometheus.NewGauge(prometheus.GaugeOpts{Name: "dflash_queue_limit", Help: "Maximum number of waiting routing requests."})
	r.reg.MustRegister(r.queueLimit)
	r.fallbacks = counter("dflash_fallback_total", "Requests served by another model than their first candidate.", []string{"from", "to"})
	r.rejections = counter("dflash_admission_rejections_total", "Requests refused by routing, by reason.", []string{"model", "reason"})
	r.policyErrors = counter("dflash_policy_errors_total", "Policy calls that failed or answered nonsense; the block order was used instead.", []string{"policy"})
	r.queueWait = hist("dflash_queue_wait_seconds", "Time admitted requests spent waiting in the routing queue.", queueBuckets, model)
	modelAPI := []string{"model", "api"}
	r.ttft = hist("dflash_time_to_first_token_seconds", "Time from the backend call to the first output (text, reasoning or tool call), by model and API.", ttftBuckets, modelAPI)
	r.tpot = hist("dflash_time_per_output_token_seconds", "Mean decode time per output token after the first, one observation per request, by model and API.", tpotBuckets, modelAPI)
	r.itl = hist("dflash_inter_token_latency_seconds", "Time between output tokens as the backend streams them (a burst of n tokens after a gap d counts n times d/n), by model and API.", tpotBuckets, modelAPI)
	r.promptTokens = counter("dflash_prompt_tokens_total", "Prompt tokens of finished requests.", model)
	r.genTokens = counter("dflash_generation_tokens_total", "Generated tokens of finished requests.", model)
	r.draftProposed = counter("dflash_draft_tokens_proposed_total", "Speculative draft tokens proposed.", model)
	r.draftAccepted = counter("dflash_draft_tokens_accepted_total", "Speculative draft tokens accepted.", model)
	r.draftSteps = counter("dflash_draft_verify_steps_total",
		"Target forwards that verified a draft block; (accepted + steps) / steps is the acceptance length, tokens per target forward.", model)
	r.requests = counter("dflash_requests_total", "HTTP generation requests by model, API and status code.", []string{"model", "api", "code"})
	r.duration = hist("dflash_request_duration_seconds", "HTTP generation request duration.", durBuckets, []string{"model", "api", "code"})
	r.backendUp = gauge("dflash_backend_up", "1 when the model's backend is ready, else 0.", []string{"model", "backend"})
	r.reg.MustRegister(restartCollector{r})

	if opts.VLLMCompat {
		compat := []string{"model_name"}
		r.compatWaiting = gauge("vllm:num_requests_waiting", "Alias of dflash_requests_waiting.", compat)
		r.compatRunning = gauge("vllm:num_requests_running", "Alias of dflash_requests_running.", compat)
		r.compatKV = gauge("vllm:kv_cache_usage_perc", "Alias of dflash_kv_cache_usage_ratio (a 0-1 fraction).", compat)
	}
	if opts.ProcessCollectors {
		r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return r
}

var restartsDesc = prometheus.NewDesc("dflash_backend_restarts_total", "Restarts of the model's backend process.", []string{"model"}, nil)

// restartCollector exports restart totals the server sets; a plain Counter
// cannot be set to a supervisor's count.
type restartCollector struct{ r *Registry }

func (c restartCollector) Describe(ch chan<- *prometheus.Desc) { ch <- restartsDesc }

func (c restartCollector) Collect(ch chan<- prometheus.Metric) {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	for model, n := range c.r.restarts {
		ch <- prometheus.MustNewConstMetric(restartsDesc, prometheus.CounterValue, n, model)
	}
}

// Prometheus returns the underlying registry, for registering more
// collectors or gathering in tests.
func (r *Registry) Prometheus() *prometheus.Registry {
	if r == nil {
		return nil
	}
	return r.reg
}

// OnScrape adds f to the functions run before each scrape by Handler; the
// router uses it to refresh engine statistics only when someone looks.
// f must return quickly.
func (r *Registry) OnScrape(f func()) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.hooks = append(r.hooks, f)
	r.mu.Unlock()
}

// Handler serves the metrics in the Prometheus text format.
func (r *Registry) Handler() http.Handler {
	if r == nil {
		return http.NotFoundHandler()
	}
	h := promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		hooks := r.hooks
		r.mu.Unlock()
		for _, f := range hooks {
			f()
		}
		h.ServeHTTP(w, req)
	})
}

// AddWaiting changes the waiting gauge of label (a model name or AnyModel).
func (r *Registry) AddWaiting(label string, delta int) {
	if r == nil {
		return
	}
	r.waiting.WithLabelValues(label).Add(float64(delta))
	if r.compatWaiting != nil {
		r.compatWaiting.WithLabelValues(label).Add(float64(delta))
	}
}

// AddRunning changes the running gauge of model.
func (r *Registry) AddRunning(model string, delta int) {
	if r == nil {
		return
	}
	r.running.WithLabelValues(model).Add(float64(delta))
	if r.compatRunning != nil {
		r.compatRunning.WithLabelValues(model).Add(float64(delta))
	}
}

// SetKV records the engine's KV tokens in use and the pool size.
func (r *Registry) SetKV(model string, used, capacity int) {
	if r == nil {
		return
	}
	ratio := 0.0
	if capacity > 0 {
		ratio = float64(used) / float64(capacity)
	}
	r.kvUsage.WithLabelValues(model).Set(ratio)
	r.kvUsed.WithLabelValues(model).Set(float64(used))
	r.kvCapacity.WithLabelValues(model).Set(float64(capacity))
	if r.compatKV != nil {
		r.compatKV.WithLabelValues(model).Set(ratio)
	}
}

// SetSlots records the listener reservations held on model and its slots.
func (r *Registry) SetSlots(model string, inUse, total int) {
	if r == nil {
		return
	}
	r.slotsInUse.WithLabelValues(model).Set(float64(inUse))
	r.slotsTotal.WithLabelValues(model).Set(float64(total))
}

// SetQueueLimit records --routing-queue-limit.
func (r *Registry) SetQueueLimit(n int) {
	if r == nil {
		return
	}
	r.queueLimit.Set(float64(n))
}

// Fallback counts a request that model to served after its first
// candidate from could not.
func (r *Registry) Fallback(from, to string) {
	if r == nil {
		return
	}
	r.fallbacks.WithLabelValues(from, to).Inc()
}

// Rejection counts a routing refusal; model is the model (or AnyModel) the
// request was meant for.
func (r *Registry) Rejection(model, reason string) {
	if r == nil {
		return
	}
	r.rejections.WithLabelValues(model, reason).Inc()
}

// PolicyError counts a failed policy call.
func (r *Registry) PolicyError(policy string) {
	if r == nil {
		return
	}
	r.policyErrors.WithLabelValues(policy).Inc()
}

// ObserveQueueWait records how long an admitted request waited.
func (r *Registry) ObserveQueueWait(model string, d time.Duration) {
	if r == nil {
		return
	}
	r.queueWait.WithLabelValues(model).Observe(d.Seconds())
}

// ObserveTTFT records the time to the first output of a request made through api.
func (r *Registry) ObserveTTFT(model, api string, d time.Duration) {
	if r == nil {
		return
	}
	r.ttft.WithLabelValues(model, api).Observe(d.Seconds())
}

// ObserveTPOT records a request's mean time per output token.
func (r *Registry) ObserveTPOT(model, api string, d time.Duration) {
	if r == nil {
		return
	}
	r.tpot.WithLabelValues(model, api).Observe(d.Seconds())
}

// ObserveITL records n output tokens that arrived together, d after the previous ones: n observations of d/n.
func (r *Registry) ObserveITL(model, api string, d time.Duration, n int) {
	if r == nil || n <= 0 {
		return
	}
	h := r.itl.WithLabelValues(model, api)
	for range n {
		h.Observe(d.Seconds() / float64(n))
	}
}

// AddTokens counts prompt and generated tokens of a finished request.
func (r *Registry) AddTokens(model string, prompt, generated int) {
	if r == nil {
		return
	}
	if prompt > 0 {
		r.promptTokens.WithLabelValues(model).Add(float64(prompt))
	}
	if generated > 0 {
		r.genTokens.WithLabelValues(model).Add(float64(generated))
	}
}

// AddDraft counts speculative draft tokens proposed and accepted, and the verify forwards that checked them.
func (r *Registry) AddDraft(model string, proposed, accepted, steps int) {
	if r == nil || (proposed <= 0 && steps <= 0) {
		return
	}
	r.draftProposed.WithLabelValues(model).Add(float64(proposed))
	r.draftAccepted.WithLabelValues(model).Add(float64(accepted))
	r.draftSteps.WithLabelValues(model).Add(float64(steps))
}

// ObserveRequest records one finished HTTP generation request (for the API
// layer): api is "chat", "messages" or "responses"; code the HTTP status,
// 499 when the client went away.
func (r *Registry) ObserveRequest(model, api string, code int, d time.Duration) {
	if r == nil {
		return
	}
	c := strconv.Itoa(code)
	r.requests.WithLabelValues(model, api, c).Inc()
	r.duration.WithLabelValues(model, api, c).Observe(d.Seconds())
}

// SetBackendUp records whether model's backend is ready.
func (r *Registry) SetBackendUp(model, backend string, up bool) {
	if r == nil {
		return
	}
	v := 0.0
	if up {
		v = 1
	}
	r.backendUp.WithLabelValues(model, backend).Set(v)
}

// SetBackendRestarts sets the restart total of model's backend, as counted
// by the process supervisor. A lower value than before is ignored, so the
// series stays a counter.
func (r *Registry) SetBackendRestarts(model string, n int) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if v := float64(n); v >= r.restarts[model] {
		r.restarts[model] = v
	}
}
