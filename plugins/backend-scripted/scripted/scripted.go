// Package scripted is the scripted test backend: output is a deterministic
// function of the request, timing and capacity come from block options, and
// admission follows the same slot + KV rules as the native engine. It exists
// for tests that need controlled timing (routing, cancellation, crashes,
// plugin-boundary benchmarks).
package scripted

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dflash/dflash_server/sdk"
)

// Architecture is the only GGUF architecture this backend serves.
const Architecture = "scripted"

// Backend implements sdk.Backend with scripted output.
type Backend struct {
	mu      sync.Mutex
	cfg     sdk.ModelConfig
	loaded  bool
	slots   int
	kvPool  int
	maxCtx  int
	defMax  int
	delay   time.Duration
	reply   string
	failAt  int
	active  int
	kvUsed  int
	gen     int64
	prompts int64
}

var _ sdk.Backend = (*Backend)(nil)

// New returns an unloaded scripted backend.
func New() *Backend { return &Backend{} }

var options = []sdk.OptionSpec{
	{Name: "scripted-token-delay", Kind: sdk.OptionString, Default: "0s", Help: "Delay before each generated token (Go duration)."},
	{Name: "scripted-reply", Kind: sdk.OptionString, Help: "Fixed reply text (default: echo the last user message)."},
	{Name: "scripted-fail-after", Kind: sdk.OptionInt, Default: "0", Help: "Fail the stream after this many tokens (0 = never)."},
}

func (b *Backend) Info(context.Context) (sdk.BackendInfo, error) {
	return sdk.BackendInfo{
		Name: "scripted", Architectures: []string{Architecture}, Devices: []string{"cpu"},
		Options: options, APIVersion: sdk.APIVersion,
	}, nil
}

func (b *Backend) ValidateOptions(_ context.Context, cfg sdk.ModelConfig) error {
	_, _, _, err := parseOptions(cfg.Options)
	return err
}

func parseOptions(o map[string]string) (delay time.Duration, reply string, failAt int, err error) {
	if v := o["scripted-token-delay"]; v != "" {
		if delay, err = time.ParseDuration(v); err != nil {
			return 0, "", 0, sdk.Invalidf("--scripted-token-delay: %v", err)
		}
	}
	if v := o["scripted-fail-after"]; v != "" {
		if failAt, err = strconv.Atoi(v); err != nil {
			return 0, "", 0, sdk.Invalidf("--scripted-fail-after: %v", err)
		}
	}
	return delay, o["scripted-reply"], failAt, nil
}

func (b *Backend) Load(ctx context.Context, cfg sdk.ModelConfig, progress func(sdk.LoadProgress)) (sdk.ModelDescription, error) {
	st, err := os.Stat(cfg.Path)
	if err != nil {
		return sdk.ModelDescription{}, fmt.Errorf("load %s: %w", cfg.Path, err)
	}
	delay, reply, failAt, err := parseOptions(cfg.Options)
	if err != nil {
		return sdk.ModelDescription{}, err
	}
	if progress != nil {
		progress(sdk.LoadProgress{Stage: "ready", BytesDone: st.Size(), BytesTotal: st.Size()})
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cfg, b.loaded = cfg, true
	b.slots = orDefault(cfg.MaxConcurrency, 4)
	b.maxCtx = orDefault(cfg.MaxCtx, 2048)
	b.kvPool = orDefault(cfg.KVPoolTokens, b.slots*b.maxCtx)
	b.defMax = orDefault(cfg.DefaultMaxTokens, 64)
	b.delay, b.reply, b.failAt = delay, reply, failAt
	return sdk.ModelDescription{
		Name: cfg.Name, Architecture: Architecture, Device: cfg.Device,
		MaxConcurrency: b.slots, KVPoolTokens: b.kvPool, MaxCtx: b.maxCtx,
		DefaultMaxTokens: b.defMax, MaxTokens: cfg.MaxTokens,
		Features: sdk.Features{Tools: true, Reasoning: true},
	}, nil
}

func orDefault(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// render is the scripted "chat template": one line per message. Prompt
// tokens are its bytes, so tests can size requests exactly.
func render(req *sdk.ChatRequest) string {
	if p := req.Prompt; p != nil {
		// A text completion's prompt is used as it is; token ids are bytes.
		if len(p.Tokens) > 0 {
			b := make([]byte, len(p.Tokens))
			for i, id := range p.Tokens {
				b[i] = byte(id)
			}
			return string(b)
		}
		return p.Text
	}
	var sb strings.Builder
	for _, m := range req.Messages {
		sb.WriteString(m.Role)
		sb.WriteString(": ")
		sb.WriteString(m.Content)
		sb.WriteByte('\n')
	}
	return sb.String()
}

func lastUser(req *sdk.ChatRequest) string {
	if req.Prompt != nil {
		return render(req)
	}
	for i := len(req.Messages) - 1; i >= 0; i-- {
		if req.Messages[i].Role == "user" {
			return req.Messages[i].Content
		}
	}
	return ""
}

// admit reserves a slot and the request's KV tokens atomically.
func (b *Backend) admit(req *sdk.ChatRequest) (sdk.Admission, int) {
	prompt := len(render(req))
	maxTok := req.MaxTokens
	if maxTok <= 0 {
		maxTok = b.defMax
	}
	need := prompt + maxTok
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case !b.loaded:
		return sdk.Admission{Outcome: sdk.OutcomeInvalid, Reason: "model not loaded"}, 0
	case req.Prompt != nil && req.Prompt.Suffix != "":
		return sdk.Admission{Outcome: sdk.OutcomeInvalid, Reason: "suffix: the scripted model has no fill-in-the-middle"}, 0
	case req.Prompt != nil && len(render(req)) == 0:
		return sdk.Admission{Outcome: sdk.OutcomeInvalid, Reason: "prompt must not be empty"}, 0
	case req.Prompt == nil && len(req.Messages) == 0:
		return sdk.Admission{Outcome: sdk.OutcomeInvalid, Reason: "messages must not be empty"}, 0
	case need > b.maxCtx:
		return sdk.Admission{Outcome: sdk.OutcomeNeverFits, PromptTokens: prompt, NeededTokens: need, LimitTokens: b.maxCtx,
			Reason: fmt.Sprintf("needs %d tokens, context is %d", need, b.maxCtx)}, 0
	case need > b.kvPool:
		return sdk.Admission{Outcome: sdk.OutcomeNeverFits, PromptTokens: prompt, NeededTokens: need, LimitTokens: b.kvPool,
			Reason: fmt.Sprintf("needs %d tokens, KV pool is %d", need, b.kvPool)}, 0
	case b.active >= b.slots:
		return sdk.Admission{Outcome: sdk.OutcomeBusy, PromptTokens: prompt, Reason: "no free slot"}, 0
	case b.kvUsed+need > b.kvPool:
		return sdk.Admission{Outcome: sdk.OutcomeBusy, PromptTokens: prompt, Reason: "not enough free KV"}, 0
	}
	b.active++
	b.kvUsed += need
	b.prompts += int64(prompt)
	return sdk.Admission{Outcome: sdk.OutcomeAdmitted, PromptTokens: prompt}, need
}

func (b *Backend) retire(need int, generated int) {
	b.mu.Lock()
	b.active--
	b.kvUsed -= need
	b.gen += int64(generated)
	b.mu.Unlock()
}

func (b *Backend) Start(ctx context.Context, req *sdk.ChatRequest, emit sdk.Emitter) error {
	adm, need := b.admit(req)
	if err := emit.Admit(adm); err != nil || adm.Outcome != sdk.OutcomeAdmitted {
		return err
	}
	generated := 0
	defer func() { b.retire(need, generated) }()

	maxTok := req.MaxTokens
	if maxTok <= 0 {
		maxTok = b.defMax
	}
	var pieces []sdk.Event
	if req.Reasoning.Enabled != nil && *req.Reasoning.Enabled {
		for _, w := range strings.Fields("let me think about this") {
			pieces = append(pieces, sdk.Event{Reasoning: w + " "})
		}
	}
	user := lastUser(req)
	// A forced choice (required or a named function) always calls, as the
	// native backends guarantee.
	forced := req.ToolChoice == "required" || strings.HasPrefix(string(req.ToolChoice), "function:")
	if len(req.Tools) > 0 && req.ToolChoice != "none" && (forced || strings.Contains(user, "call a tool")) {
		t := req.Tools[0]
		if name, ok := strings.CutPrefix(string(req.ToolChoice), "function:"); ok {
			t.Name = name
		}
		pieces = append(pieces,
			sdk.Event{ToolCalls: []sdk.ToolCallDelta{{Index: 0, ID: "call_scripted_0", Name: t.Name}}},
			sdk.Event{ToolCalls: []sdk.ToolCallDelta{{Index: 0, ArgumentsDelta: `{"input":`}}},
			sdk.Event{ToolCalls: []sdk.ToolCallDelta{{Index: 0, ArgumentsDelta: strconv.Quote(user) + `}`}}})
	} else {
		reply := b.reply
		if reply == "" {
			reply = "echo: " + user
		}
		words := strings.SplitAfter(reply, " ")
		for i := 0; req.IgnoreEOS && len(words) < maxTok && i < maxTok; i++ {
			words = append(words, strings.SplitAfter(" "+reply, " ")...)
		}
		for _, w := range words {
			if w != "" {
				pieces = append(pieces, sdk.Event{Text: w})
			}
		}
	}

	finish := sdk.FinishStop
	if len(pieces) > 0 && len(pieces[len(pieces)-1].ToolCalls) > 0 {
		finish = sdk.FinishToolCalls
	}
	var text strings.Builder
	stopSeq := ""
	for i, p := range pieces {
		if generated >= maxTok {
			finish = sdk.FinishLength
			break
		}
		if b.delay > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(b.delay):
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if b.failAt > 0 && generated >= b.failAt {
			return errors.New("scripted failure after " + strconv.Itoa(generated) + " tokens")
		}
		text.WriteString(p.Text)
		if s := matchStop(text.String(), req.Stop); s != "" {
			finish, stopSeq = sdk.FinishStopSequence, s
			break
		}
		p.TokenIDs = []int32{int32(i)}
		generated++
		if err := emit.Emit(p); err != nil {
			return err
		}
	}
	return emit.Emit(sdk.Event{Finish: &sdk.Finish{
		Reason: finish, StopSequence: stopSeq,
		Usage: sdk.Usage{PromptTokens: adm.PromptTokens, CompletionTokens: generated},
	}})
}

func matchStop(text string, stops []string) string {
	for _, s := range stops {
		if s != "" && strings.Contains(text, s) {
			return s
		}
	}
	return ""
}

func (b *Backend) Tokenize(_ context.Context, text string, _ bool) ([]int32, error) {
	ids := make([]int32, len(text))
	for i := 0; i < len(text); i++ {
		ids[i] = int32(text[i])
	}
	return ids, nil
}

func (b *Backend) Detokenize(_ context.Context, ids []int32) (string, error) {
	buf := make([]byte, len(ids))
	for i, id := range ids {
		if id < 0 || id > 255 {
			return "", sdk.Invalidf("token id %d out of range [0, 255]", id)
		}
		buf[i] = byte(id)
	}
	return string(buf), nil
}

func (b *Backend) CountTokens(_ context.Context, req *sdk.ChatRequest) (int, error) {
	return len(render(req)), nil
}

func (b *Backend) Stats(context.Context) (sdk.ModelStats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return sdk.ModelStats{ActiveSequences: b.active, KVTokensUsed: b.kvUsed, KVTokensTotal: b.kvPool,
		TokensGenerated: b.gen, PromptTokens: b.prompts}, nil
}

func (b *Backend) Shutdown(context.Context) error { return nil }
