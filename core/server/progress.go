package server

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/mattn/go-isatty"

	"github.com/dflash/dflash_server/sdk"
)

// progressBoard shows the load progress of every model. On a terminal it
// redraws one status line (bytes of weights uploaded per model); otherwise
// it logs plain lines at each stage change and every 10 % of the bytes, so
// log files stay readable.
type progressBoard struct {
	logger hclog.Logger
	out    io.Writer // nil when not a terminal
	mu     sync.Mutex
	models map[string]*modelProgress
}

type modelProgress struct {
	stage  string
	decile int64
	lp     sdk.LoadProgress
}

func newProgressBoard(logger hclog.Logger, stderr io.Writer) *progressBoard {
	b := &progressBoard{logger: logger, models: map[string]*modelProgress{}}
	if f, ok := stderr.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
		b.out = stderr
	}
	return b
}

// reporter returns the progress callback of one model.
func (b *progressBoard) reporter(model string) func(sdk.LoadProgress) {
	b.mu.Lock()
	b.models[model] = &modelProgress{decile: -1}
	b.mu.Unlock()
	return func(lp sdk.LoadProgress) { b.report(model, lp) }
}

func (b *progressBoard) report(model string, lp sdk.LoadProgress) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.models[model]
	m.lp = lp
	if b.out != nil {
		fmt.Fprintf(b.out, "\r\033[K%s", b.line())
		return
	}
	d := int64(-1)
	if lp.BytesTotal > 0 {
		d = lp.BytesDone * 10 / lp.BytesTotal
	}
	if lp.Stage == m.stage && d == m.decile {
		return
	}
	m.stage, m.decile = lp.Stage, d
	b.logger.Info("loading", "model", model, "stage", lp.Stage,
		"mb_done", lp.BytesDone>>20, "mb_total", lp.BytesTotal>>20)
}

// line renders "loading a 120/800 MB (uploading) | b 40/40 MB (ready)".
func (b *progressBoard) line() string {
	names := make([]string, 0, len(b.models))
	for n := range b.models {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, n := range names {
		lp := b.models[n].lp
		parts = append(parts, fmt.Sprintf("%s %d/%d MB (%s)", n, lp.BytesDone>>20, lp.BytesTotal>>20, lp.Stage))
	}
	return "loading " + strings.Join(parts, " | ")
}

// done ends the status line on a terminal.
func (b *progressBoard) done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.out != nil {
		fmt.Fprintln(b.out)
	}
}
