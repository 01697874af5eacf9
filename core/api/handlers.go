package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/jsonprefix"
	"github.com/julienschmidt/httprouter"
)

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r, s.lim)
	if e != nil {
		s.fail(w, r, e)
		return
	}
	req, opts, e := decodeChat(body, s.lim)
	if e != nil {
		s.fail(w, r, e)
		return
	}
	reqID := requestID(r)
	id, created := s.newID("chatcmpl-"), s.now().Unix()
	s.run(w, r, generation{shape: shapeOpenAI, requestID: reqID, req: req, stream: opts.stream,
		newSink: func(st Stream, w http.ResponseWriter) sink {
			if opts.stream {
				return newChatStream(w, st, id, created, opts, req.Logprobs)
			}
			return &chatWhole{w: w, st: st, id: id, created: created, logprobs: req.Logprobs, reqID: reqID}
		}})
}

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r, s.lim)
	if e != nil {
		s.fail(w, r, e)
		return
	}
	req, opts, e := decodeCompletion(body, s.lim)
	if e != nil {
		s.fail(w, r, e)
		return
	}
	reqID := requestID(r)
	id, created := s.newID("cmpl-"), s.now().Unix()
	s.run(w, r, generation{shape: shapeOpenAI, requestID: reqID, req: req, stream: opts.stream,
		newSink: func(st Stream, w http.ResponseWriter) sink {
			cw := newCompletionWriter(w, st, id, created, reqID, s.echoText(r, st, req.Prompt, opts.echo), opts)
			if opts.stream {
				return completionStream{cw}
			}
			return cw
		}})
}

// echoText is the prompt as text for echo; token ids are detokenized by
// the model that admitted them, which already checked they are in its
// vocabulary.
func (s *Server) echoText(r *http.Request, st Stream, p *sdk.RawPrompt, echo bool) string {
	if !echo {
		return ""
	}
	if len(p.Tokens) == 0 {
		return p.Text
	}
	_, text, err := s.rt.Detokenize(r.Context(), st.Model(), p.Tokens)
	if err != nil {
		s.opts.Logger.Error("echo: detokenize the prompt", "request_id", requestID(r), "model", st.Model(), "error", err)
		return ""
	}
	return text
}

func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r, s.lim)
	if e != nil {
		s.fail(w, r, e)
		return
	}
	req, stream, e := decodeMessages(body, s.lim, false)
	if e != nil {
		s.fail(w, r, e)
		return
	}
	reqID := requestID(r)
	id := s.newID("msg_")
	s.run(w, r, generation{shape: shapeAnthropic, requestID: reqID, req: req, stream: stream,
		newSink: func(st Stream, w http.ResponseWriter) sink {
			if stream {
				return newAnthropicStream(w, st, id)
			}
			return &anthropicWhole{w: w, st: st, id: id, reqID: reqID}
		}})
}

func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r, s.lim)
	if e != nil {
		s.fail(w, r, e)
		return
	}
	req, stream, echo, e := decodeResponses(body, s.lim)
	if e != nil {
		s.fail(w, r, e)
		return
	}
	reqID := requestID(r)
	id, created := s.newID("resp_"), s.now().Unix()
	s.run(w, r, generation{shape: shapeOpenAI, requestID: reqID, req: req, stream: stream,
		newSink: func(st Stream, w http.ResponseWriter) sink {
			base := responseBase{id: id, created: created, model: st.Model(), echo: echo}
			if stream {
				return newResponsesStream(w, base)
			}
			return &responsesWhole{responseBase: base, w: w, reqID: reqID}
		}})
}

// handleCountTokens counts with the model's own template and tokenizer;
// it takes no slot and never queues (api-conventions §3.6).
func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r, s.lim)
	if e != nil {
		s.fail(w, r, e)
		return
	}
	req, _, e := decodeMessages(body, s.lim, true)
	if e != nil {
		s.fail(w, r, e)
		return
	}
	req.ID = requestID(r)
	model, n, err := s.rt.CountTokens(r.Context(), req)
	if err != nil {
		s.tokenError(w, r, err)
		return
	}
	w.Header().Set("X-Dflash-Model", model)
	writeJSON(w, http.StatusOK, struct {
		InputTokens int `json:"input_tokens"`
	}{n})
}

func (s *Server) tokenError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return
	}
	sh := shapeOf(r.URL.Path)
	writeError(w, sh, requestID(r), s.errorFor(err, sh))
}

// tokenizeRequest is llama.cpp server's /tokenize body plus model.
type tokenizeRequest struct {
	Model      string  `json:"model"`
	Content    *string `json:"content"`
	AddSpecial bool    `json:"add_special"`
}

func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r, s.lim)
	if e != nil {
		s.fail(w, r, e)
		return
	}
	var in tokenizeRequest
	if e := decodeJSON(body, s.lim, &in); e != nil {
		s.fail(w, r, e)
		return
	}
	if in.Content == nil {
		s.fail(w, r, missingParam("content"))
		return
	}
	model, ids, err := s.rt.Tokenize(r.Context(), in.Model, *in.Content, in.AddSpecial)
	if err != nil {
		s.tokenError(w, r, err)
		return
	}
	if ids == nil {
		ids = []int32{}
	}
	w.Header().Set("X-Dflash-Model", model)
	writeJSON(w, http.StatusOK, struct {
		Tokens []int32 `json:"tokens"`
	}{ids})
}

type detokenizeRequest struct {
	Model  string  `json:"model"`
	Tokens []int32 `json:"tokens"`
}

func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r, s.lim)
	if e != nil {
		s.fail(w, r, e)
		return
	}
	var in detokenizeRequest
	if e := decodeJSON(body, s.lim, &in); e != nil {
		s.fail(w, r, e)
		return
	}
	if in.Tokens == nil {
		s.fail(w, r, missingParam("tokens"))
		return
	}
	model, text, err := s.rt.Detokenize(r.Context(), in.Model, in.Tokens)
	if err != nil {
		s.tokenError(w, r, err)
		return
	}
	w.Header().Set("X-Dflash-Model", model)
	writeJSON(w, http.StatusOK, struct {
		Content string `json:"content"`
	}{text})
}

type modelEntry struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	OwnedBy string          `json:"owned_by"`
	Dflash  json.RawMessage `json:"dflash,omitempty"`
}

// anthropicModel is a model in the Anthropic Models API's shape.
type anthropicModel struct {
	Type        string `json:"type"`
	ID          string `json:"id"`
	DisplayName string `json:"display_name"`
	CreatedAt   string `json:"created_at"`
}

// modelEntries lists the router's models in OpenAI's shape; the router's
// per-model status rides along under "dflash" (SDKs ignore extra keys).
func (s *Server) modelEntries() ([]modelEntry, error) {
	ms := s.rt.Models()
	data := make([]modelEntry, 0, len(ms))
	for _, m := range ms {
		raw, err := marshal(m)
		if err != nil {
			return nil, fmt.Errorf("encode model status: %w", err)
		}
		var named struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(raw, &named)
		data = append(data, modelEntry{ID: named.Name, Object: "model", Created: s.created, OwnedBy: s.opts.OwnedBy, Dflash: raw})
	}
	return data, nil
}

func (s *Server) anthropicModel(e modelEntry) anthropicModel {
	return anthropicModel{Type: "model", ID: e.ID, DisplayName: e.ID, CreatedAt: time.Unix(e.Created, 0).UTC().Format(time.RFC3339)}
}

// handleModels answers OpenAI's list shape, or Anthropic's when the client
// sends anthropic-version (the Anthropic SDK's models.list).
func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	data, err := s.modelEntries()
	if err != nil {
		s.fail(w, r, internalError("%v", err))
		return
	}
	if r.Header.Get("Anthropic-Version") != "" {
		out := make([]anthropicModel, len(data))
		for i, e := range data {
			out[i] = s.anthropicModel(e)
		}
		var first, last *string
		if len(out) > 0 {
			first, last = &out[0].ID, &out[len(out)-1].ID
		}
		writeJSON(w, http.StatusOK, struct {
			Data    []anthropicModel `json:"data"`
			HasMore bool             `json:"has_more"`
			FirstID *string          `json:"first_id"`
			LastID  *string          `json:"last_id"`
		}{out, false, first, last})
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Object string       `json:"object"`
		Data   []modelEntry `json:"data"`
	}{"list", data})
}

// handleModel answers GET /v1/models/{id} (models.retrieve in both SDKs).
func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(httprouter.ParamsFromContext(r.Context()).ByName("id"), "/")
	data, err := s.modelEntries()
	if err != nil {
		s.fail(w, r, internalError("%v", err))
		return
	}
	for _, e := range data {
		if e.ID != id {
			continue
		}
		if r.Header.Get("Anthropic-Version") != "" {
			writeJSON(w, http.StatusOK, s.anthropicModel(e))
			return
		}
		writeJSON(w, http.StatusOK, e)
		return
	}
	names := make([]string, len(data))
	for i, e := range data {
		names[i] = e.ID
	}
	e := &apiError{status: http.StatusNotFound, code: "model_not_found", param: "model",
		message: fmt.Sprintf("model %q is not loaded; loaded models: %s", id, strings.Join(names, ", "))}
	if r.Header.Get("Anthropic-Version") != "" {
		writeError(w, shapeAnthropic, requestID(r), e)
		return
	}
	s.fail(w, r, e)
}

// handleHealth is liveness: if it answers, the process is alive. Backends
// never make it fail (api-conventions §7.2 rule 3).
func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) handleReady(w http.ResponseWriter, _ *http.Request) {
	if s.opts.Ready != nil {
		if ok, state := s.opts.Ready(); !ok {
			if state == "" {
				state = "unavailable"
			}
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": state})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	st, err := json.Marshal(s.rt.Status())
	var fields map[string]json.RawMessage
	if err == nil {
		err = json.Unmarshal(st, &fields)
	}
	if err != nil {
		s.fail(w, r, &apiError{status: http.StatusInternalServerError, code: "internal_error", message: fmt.Sprintf("status: %v", err)})
		return
	}
	fields["api"], _ = json.Marshal(apiSurface)
	writeJSON(w, http.StatusOK, fields)
}

// apiSurface is what /props advertises about the request shapes served,
// so that a client can find out before it sends a schema that is refused.
var apiSurface = struct {
	Endpoints       []string `json:"endpoints"`
	ResponseFormats []string `json:"response_formats"`
	// JSONSchemaKeywords are enforced by the native engine's constrained
	// decoding; other keywords are refused naming the keyword, and
	// JSONSchemaIgnored are accepted as annotations.
	JSONSchemaKeywords []string `json:"json_schema_keywords"`
	JSONSchemaIgnored  []string `json:"json_schema_ignored"`
	ToolChoice         []string `json:"tool_choice"`
	TextCompletions    struct {
		PromptForms []string `json:"prompt_forms"`
		Suffix      bool     `json:"suffix"`
		MaxN        int      `json:"max_n"`
		MaxLogprobs int      `json:"max_logprobs"`
	} `json:"text_completions"`
}{
	Endpoints:          []string{"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"},
	ResponseFormats:    []string{"text", "json_object", "json_schema"},
	JSONSchemaKeywords: jsonprefix.SchemaKeywords,
	JSONSchemaIgnored:  jsonprefix.Annotations,
	ToolChoice:         []string{"auto", "none", "required", "function"},
	TextCompletions: struct {
		PromptForms []string `json:"prompt_forms"`
		Suffix      bool     `json:"suffix"`
		MaxN        int      `json:"max_n"`
		MaxLogprobs int      `json:"max_logprobs"`
	}{PromptForms: []string{"string", "token ids", "one-element array of either"}, Suffix: false, MaxN: 1, MaxLogprobs: maxLegacyLogprobs},
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	if s.opts.Metrics == nil {
		s.fail(w, r, &apiError{status: http.StatusNotFound, code: "not_found", message: "metrics are not enabled"})
		return
	}
	s.opts.Metrics.ServeHTTP(w, r)
}
