package router

import (
	"context"
	"sync"
	"time"

	"github.com/dflash/dflash_server/core/admission"
	"github.com/dflash/dflash_server/core/health"
	"github.com/dflash/dflash_server/sdk"
)

// Stats refresh bounds: a snapshot younger than statsMaxAge is reused;
// callers wait at most statsWait for fresh numbers (a stuck backend shows
// its last known state instead of blocking /status/json or /metrics), and
// one fetch is abandoned after statsTimeout.
const (
	statsMaxAge  = time.Second
	statsWait    = 200 * time.Millisecond
	statsTimeout = 2 * time.Second
)

type statsCache struct {
	mu       sync.Mutex
	st       sdk.ModelStats
	ok       bool
	at       time.Time
	fetching bool
}

func (c *statsCache) kv() (used int, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st.KVTokensUsed, c.ok
}

func (c *statsCache) get() (sdk.ModelStats, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st, c.ok
}

// refreshStats fetches stale engine statistics in the background and waits
// up to statsWait for them.
func (r *Router) refreshStats() {
	var wg sync.WaitGroup
	now := time.Now()
	for i, m := range r.models {
		c := &r.stats[i]
		c.mu.Lock()
		stale := !c.fetching && now.Sub(c.at) >= statsMaxAge
		if stale {
			c.fetching = true
		}
		c.mu.Unlock()
		if !stale {
			continue
		}
		if st, _ := m.health(); st != health.Ready {
			c.mu.Lock()
			c.fetching = false
			c.mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), statsTimeout)
			defer cancel()
			st, err := m.Backend.Stats(ctx)
			c.mu.Lock()
			c.fetching = false
			c.at = time.Now()
			if err == nil {
				c.st, c.ok = st, true
			}
			c.mu.Unlock()
			if err != nil {
				r.log.Debug("backend stats failed", "model", m.Name, "err", err)
				return
			}
			total := st.KVTokensTotal
			if total == 0 {
				total = m.Desc.KVPoolTokens
			}
			r.met.SetKV(m.Name, st.KVTokensUsed, total)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(statsWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// scrape runs before each /metrics scrape.
func (r *Router) scrape() {
	r.refreshStats()
	var c admission.Counts
	r.adm.Counts(&c)
	for i, m := range r.models {
		st, restarts := m.health()
		r.met.SetSlots(m.Name, c.InUse[i], c.Slots[i])
		r.met.SetBackendUp(m.Name, m.Info.BackendName, st == health.Ready)
		r.met.SetBackendRestarts(m.Name, restarts)
	}
}

// Capacity is what a model can hold at once.
type Capacity struct {
	Slots        int `json:"slots"`
	KVPoolTokens int `json:"kv_pool_tokens"`
	MaxCtx       int `json:"max_ctx"`
}

// ModelStatus is one loaded model for /v1/models, /props and /status/json.
type ModelStatus struct {
	Name string `json:"name"`
	// Priority is the model's place in the operator's order, 0 = primary.
	Priority int  `json:"priority"`
	Primary  bool `json:"primary"`
	ModelInfo
	State    health.State `json:"state"`
	Restarts int          `json:"restarts"`
	Capacity Capacity     `json:"capacity"`
	// InFlight is listener reservations held (admitted, retiring or
	// draining, plus attempts in progress).
	InFlight int `json:"in_flight"`
	// Waiting is queued requests that this model may serve.
	Waiting int `json:"waiting"`
	// From the engine's last statistics (absent until first fetched).
	ActiveSequences int     `json:"active_sequences"`
	KVTokensUsed    int     `json:"kv_tokens_used"`
	DraftAcceptance float64 `json:"draft_acceptance,omitempty"`
	// AcceptanceLength is the tokens committed per verify forward of the target (accepted proposals + the bonus).
	AcceptanceLength float64 `json:"acceptance_length,omitempty"`
	// Description is the backend's full description (features, defaults).
	Description sdk.ModelDescription `json:"-"`
}

// Status is the router's state for /status/json.
type Status struct {
	Policy        string   `json:"policy"`
	LoadBalancing bool     `json:"load_balancing"`
	Priority      []string `json:"priority"`
	QueueLimit    int      `json:"queue_limit"`
	// QueueTimeoutSeconds is 0 when requests may wait indefinitely.
	QueueTimeoutSeconds float64       `json:"queue_timeout_seconds"`
	Waiting             int           `json:"waiting"`
	ShuttingDown        bool          `json:"shutting_down"`
	Models              []ModelStatus `json:"models"`
}

// Models lists the loaded models in priority order from cached state; it
// never calls a backend.
func (r *Router) Models() []ModelStatus {
	var c admission.Counts
	r.adm.Counts(&c)
	out := make([]ModelStatus, len(r.models))
	for i, m := range r.models {
		st, restarts := m.health()
		ms := ModelStatus{
			Name:        m.Name,
			Priority:    i,
			Primary:     i == 0,
			ModelInfo:   m.Info,
			State:       st,
			Restarts:    restarts,
			Capacity:    Capacity{Slots: c.Slots[i], KVPoolTokens: m.Desc.KVPoolTokens, MaxCtx: m.Desc.MaxCtx},
			InFlight:    c.InUse[i],
			Waiting:     c.Wanted[i],
			Description: m.Desc,
		}
		if es, ok := r.stats[i].get(); ok {
			ms.ActiveSequences = es.ActiveSequences
			ms.KVTokensUsed = es.KVTokensUsed
			if es.DraftProposed > 0 {
				ms.DraftAcceptance = float64(es.DraftAccepted) / float64(es.DraftProposed)
			}
			if es.DraftSteps > 0 {
				ms.AcceptanceLength = float64(es.DraftAccepted+es.DraftSteps) / float64(es.DraftSteps)
			}
		}
		out[i] = ms
	}
	return out
}

// Status is the routing state with engine statistics at most a second old
// (it waits at most 200ms for a backend).
func (r *Router) Status() Status {
	r.refreshStats()
	st := Status{
		Policy:              r.policy.Load().name,
		LoadBalancing:       r.cfg.LoadBalancing,
		Priority:            append([]string(nil), r.names...),
		QueueLimit:          r.cfg.QueueLimit,
		QueueTimeoutSeconds: r.cfg.QueueTimeout.Seconds(),
		Waiting:             r.adm.Waiting(),
		ShuttingDown:        r.adm.Closed(),
		Models:              r.Models(),
	}
	if !r.cfg.LoadBalancing {
		st.Policy = "primary-only"
	}
	return st
}
