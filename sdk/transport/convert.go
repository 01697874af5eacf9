package transport

import (
	"github.com/dflash/dflash_server/sdk"
	backendv1 "github.com/dflash/dflash_server/sdk/proto/dflash/backend/v1"
	policyv1 "github.com/dflash/dflash_server/sdk/proto/dflash/policy/v1"
)

// Conversions between the Go types plugin authors use and the wire types.

// modelBytes is text a model produced, for a proto bytes field: it may be
// an incomplete UTF-8 sequence, which a string field would refuse to
// marshal. Empty text stays nil so the field is left off the wire.
func modelBytes(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}

func optionToProto(o sdk.OptionSpec) *backendv1.OptionSpec {
	return &backendv1.OptionSpec{
		Name: o.Name, Kind: backendv1.OptionSpec_Kind(o.Kind), DefaultValue: o.Default,
		Help: o.Help, EnumValues: o.Enum, SharedProcessPolicy: o.SharedProcessPolicy,
	}
}

func optionFromProto(o *backendv1.OptionSpec) sdk.OptionSpec {
	return sdk.OptionSpec{
		Name: o.GetName(), Kind: sdk.OptionKind(o.GetKind()), Default: o.GetDefaultValue(),
		Help: o.GetHelp(), Enum: o.GetEnumValues(), SharedProcessPolicy: o.GetSharedProcessPolicy(),
	}
}

func configToProto(c sdk.ModelConfig) *backendv1.ModelConfig {
	eb := make(map[string]int32, len(c.EffortBudgets))
	for k, v := range c.EffortBudgets {
		eb[k] = int32(v)
	}
	return &backendv1.ModelConfig{
		Path: c.Path, Name: c.Name, Architecture: c.Architecture, Device: c.Device, LibDir: c.LibDir,
		MaxCtx: int32(c.MaxCtx), MaxConcurrency: int32(c.MaxConcurrency), KvPoolTokens: int32(c.KVPoolTokens),
		DefaultMaxTokens: int32(c.DefaultMaxTokens), MaxTokens: int32(c.MaxTokens),
		HardLimitReplyBudget: int32(c.HardLimitReplyBudget), ThinkMaxTokens: int32(c.ThinkMaxTokens),
		EffortBudgets: eb, Options: c.Options, MultiModel: c.MultiModel,
	}
}

func configFromProto(c *backendv1.ModelConfig) sdk.ModelConfig {
	eb := make(map[string]int, len(c.GetEffortBudgets()))
	for k, v := range c.GetEffortBudgets() {
		eb[k] = int(v)
	}
	opts := c.GetOptions()
	if opts == nil {
		opts = map[string]string{}
	}
	return sdk.ModelConfig{
		Path: c.GetPath(), Name: c.GetName(), Architecture: c.GetArchitecture(), Device: c.GetDevice(),
		LibDir: c.GetLibDir(), MaxCtx: int(c.GetMaxCtx()), MaxConcurrency: int(c.GetMaxConcurrency()),
		KVPoolTokens: int(c.GetKvPoolTokens()), DefaultMaxTokens: int(c.GetDefaultMaxTokens()),
		MaxTokens: int(c.GetMaxTokens()), HardLimitReplyBudget: int(c.GetHardLimitReplyBudget()),
		ThinkMaxTokens: int(c.GetThinkMaxTokens()), EffortBudgets: eb, Options: opts,
		MultiModel: c.GetMultiModel(),
	}
}

func descToProto(d sdk.ModelDescription) *backendv1.ModelDescription {
	return &backendv1.ModelDescription{
		Name: d.Name, Architecture: d.Architecture, Device: d.Device, DraftDevice: d.DraftDevice,
		MaxConcurrency: int32(d.MaxConcurrency), KvPoolTokens: int32(d.KVPoolTokens), MaxCtx: int32(d.MaxCtx),
		DefaultMaxTokens: int32(d.DefaultMaxTokens), MaxTokens: int32(d.MaxTokens),
		Features: &backendv1.Features{
			Tools: d.Features.Tools, Reasoning: d.Features.Reasoning,
			Logprobs: d.Features.Logprobs, Speculative: d.Features.Speculative,
		},
		ParameterCount: d.ParameterCount, WeightBytes: d.WeightBytes,
	}
}

func descFromProto(d *backendv1.ModelDescription) sdk.ModelDescription {
	f := d.GetFeatures()
	return sdk.ModelDescription{
		Name: d.GetName(), Architecture: d.GetArchitecture(), Device: d.GetDevice(), DraftDevice: d.GetDraftDevice(),
		MaxConcurrency: int(d.GetMaxConcurrency()), KVPoolTokens: int(d.GetKvPoolTokens()), MaxCtx: int(d.GetMaxCtx()),
		DefaultMaxTokens: int(d.GetDefaultMaxTokens()), MaxTokens: int(d.GetMaxTokens()),
		Features: sdk.Features{
			Tools: f.GetTools(), Reasoning: f.GetReasoning(),
			Logprobs: f.GetLogprobs(), Speculative: f.GetSpeculative(),
		},
		ParameterCount: d.GetParameterCount(), WeightBytes: d.GetWeightBytes(),
	}
}

func admissionToProto(a sdk.Admission) *backendv1.Admission {
	return &backendv1.Admission{
		Outcome: backendv1.Admission_Outcome(a.Outcome), PromptTokens: int32(a.PromptTokens),
		NeededTokens: int32(a.NeededTokens), LimitTokens: int32(a.LimitTokens), Reason: a.Reason,
	}
}

func admissionFromProto(a *backendv1.Admission) sdk.Admission {
	return sdk.Admission{
		Outcome: sdk.Outcome(a.GetOutcome()), PromptTokens: int(a.GetPromptTokens()),
		NeededTokens: int(a.GetNeededTokens()), LimitTokens: int(a.GetLimitTokens()), Reason: a.GetReason(),
	}
}

func eventToProto(e sdk.Event) *backendv1.Event {
	pe := &backendv1.Event{Reasoning: modelBytes(e.Reasoning), Text: modelBytes(e.Text), TokenIds: e.TokenIDs}
	for _, tc := range e.ToolCalls {
		pe.ToolCalls = append(pe.ToolCalls, &backendv1.ToolCallDelta{
			Index: int32(tc.Index), Id: modelBytes(tc.ID), Name: modelBytes(tc.Name), ArgumentsDelta: modelBytes(tc.ArgumentsDelta),
		})
	}
	for _, lp := range e.Logprobs {
		plp := &backendv1.TokenLogprob{Token: modelBytes(lp.Token), Logprob: lp.Logprob, Bytes: lp.Bytes}
		for _, t := range lp.Top {
			plp.Top = append(plp.Top, &backendv1.TopLogprob{Token: modelBytes(t.Token), Logprob: t.Logprob, Bytes: t.Bytes})
		}
		pe.Logprobs = append(pe.Logprobs, plp)
	}
	if f := e.Finish; f != nil {
		pe.Finish = &backendv1.Finish{
			Reason: backendv1.Finish_Reason(f.Reason), StopSequence: f.StopSequence,
			Usage: &backendv1.Usage{
				PromptTokens: int32(f.Usage.PromptTokens), CompletionTokens: int32(f.Usage.CompletionTokens),
				ReasoningTokens: int32(f.Usage.ReasoningTokens), CachedTokens: int32(f.Usage.CachedTokens),
			},
			Timings: &backendv1.Timings{
				PrefillMs: f.Timings.PrefillMS, DecodeMs: f.Timings.DecodeMS,
				DraftAccepted: int32(f.Timings.DraftAccepted), DraftProposed: int32(f.Timings.DraftProposed), DraftSteps: int32(f.Timings.DraftSteps),
			},
		}
	}
	return pe
}

func eventFromProto(pe *backendv1.Event) sdk.Event {
	e := sdk.Event{Reasoning: string(pe.GetReasoning()), Text: string(pe.GetText()), TokenIDs: pe.GetTokenIds()}
	for _, tc := range pe.GetToolCalls() {
		e.ToolCalls = append(e.ToolCalls, sdk.ToolCallDelta{
			Index: int(tc.GetIndex()), ID: string(tc.GetId()), Name: string(tc.GetName()), ArgumentsDelta: string(tc.GetArgumentsDelta()),
		})
	}
	for _, plp := range pe.GetLogprobs() {
		lp := sdk.TokenLogprob{Token: string(plp.GetToken()), Logprob: plp.GetLogprob(), Bytes: plp.GetBytes()}
		for _, t := range plp.GetTop() {
			lp.Top = append(lp.Top, sdk.TopLogprob{Token: string(t.GetToken()), Logprob: t.GetLogprob(), Bytes: t.GetBytes()})
		}
		e.Logprobs = append(e.Logprobs, lp)
	}
	if pf := pe.GetFinish(); pf != nil {
		u, t := pf.GetUsage(), pf.GetTimings()
		e.Finish = &sdk.Finish{
			Reason: sdk.FinishReason(pf.GetReason()), StopSequence: pf.GetStopSequence(),
			Usage: sdk.Usage{
				PromptTokens: int(u.GetPromptTokens()), CompletionTokens: int(u.GetCompletionTokens()),
				ReasoningTokens: int(u.GetReasoningTokens()), CachedTokens: int(u.GetCachedTokens()),
			},
			Timings: sdk.Timings{
				PrefillMS: t.GetPrefillMs(), DecodeMS: t.GetDecodeMs(),
				DraftAccepted: int(t.GetDraftAccepted()), DraftProposed: int(t.GetDraftProposed()), DraftSteps: int(t.GetDraftSteps()),
			},
		}
	}
	return e
}

func statsToProto(s sdk.ModelStats) *backendv1.StatsResponse {
	return &backendv1.StatsResponse{
		ActiveSequences: int32(s.ActiveSequences), KvTokensUsed: int32(s.KVTokensUsed),
		KvTokensTotal: int32(s.KVTokensTotal), DraftAccepted: s.DraftAccepted, DraftProposed: s.DraftProposed, DraftSteps: s.DraftSteps,
		TokensGenerated: s.TokensGenerated, PromptTokens: s.PromptTokens,
	}
}

func statsFromProto(s *backendv1.StatsResponse) sdk.ModelStats {
	return sdk.ModelStats{
		ActiveSequences: int(s.GetActiveSequences()), KVTokensUsed: int(s.GetKvTokensUsed()),
		KVTokensTotal: int(s.GetKvTokensTotal()), DraftAccepted: s.GetDraftAccepted(),
		DraftProposed: s.GetDraftProposed(), DraftSteps: s.GetDraftSteps(), TokensGenerated: s.GetTokensGenerated(), PromptTokens: s.GetPromptTokens(),
	}
}

func snapshotToProto(s sdk.Snapshot) *policyv1.OrderRequest {
	r := &policyv1.OrderRequest{RequestedModel: s.RequestedModel, Waiting: int32(s.Waiting)}
	for _, m := range s.Models {
		r.Models = append(r.Models, &policyv1.ModelState{
			Name: m.Name, Primary: m.Primary, Available: m.Available, Slots: int32(m.Slots),
			InFlight: int32(m.InFlight), KvPoolTokens: int32(m.KVPoolTokens), KvTokensUsed: int32(m.KVTokensUsed),
			MaxCtx: int32(m.MaxCtx), Fits: m.Fits,
		})
	}
	return r
}

func snapshotFromProto(r *policyv1.OrderRequest) sdk.Snapshot {
	s := sdk.Snapshot{RequestedModel: r.GetRequestedModel(), Waiting: int(r.GetWaiting())}
	for _, m := range r.GetModels() {
		s.Models = append(s.Models, sdk.ModelState{
			Name: m.GetName(), Primary: m.GetPrimary(), Available: m.GetAvailable(), Slots: int(m.GetSlots()),
			InFlight: int(m.GetInFlight()), KVPoolTokens: int(m.GetKvPoolTokens()), KVTokensUsed: int(m.GetKvTokensUsed()),
			MaxCtx: int(m.GetMaxCtx()), Fits: m.GetFits(),
		})
	}
	return s
}
