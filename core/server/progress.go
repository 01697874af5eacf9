package server

import (
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/dflash/dflash_server/sdk"
)

// progress logs a model's load progress: each stage change and every 10 %
// of the weight bytes, as plain log lines (readable on a terminal and in a
// log file alike).
type progress struct {
	logger hclog.Logger
	model  string
	mu     sync.Mutex
	stage  string
	decile int64
}

func newProgress(logger hclog.Logger, model string) *progress {
	return &progress{logger: logger, model: model, decile: -1}
}

func (p *progress) report(lp sdk.LoadProgress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := int64(-1)
	if lp.BytesTotal > 0 {
		d = lp.BytesDone * 10 / lp.BytesTotal
	}
	if lp.Stage == p.stage && d == p.decile {
		return
	}
	p.stage, p.decile = lp.Stage, d
	p.logger.Info("loading", "model", p.model, "stage", lp.Stage,
		"mb_done", lp.BytesDone>>20, "mb_total", lp.BytesTotal>>20)
}
