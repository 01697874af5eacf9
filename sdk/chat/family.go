package chat

import (
	"slices"
	"strings"
)

// Family is a model family's output conventions: its thinking tags and its
// tool-call syntax.
type Family int

const (
	// FamilyUnknown parses <think> reasoning and no tool calls.
	FamilyUnknown Family = iota
	// FamilyQwen3 is Qwen3: <think> reasoning, JSON tool calls inside
	// <tool_call>…</tool_call>.
	FamilyQwen3
	// FamilyQwen35 is Qwen3.5 / 3.6 / 3.8: thinking pre-opened by the
	// prompt, XML tool calls
	// <tool_call><function=NAME><parameter=P>V</parameter></function></tool_call>.
	FamilyQwen35
	// FamilyDeepSeekV4 is DeepSeek V4: <think> reasoning, DSML tool calls
	// <｜DSML｜tool_calls><｜DSML｜invoke name="…">…</｜DSML｜tool_calls>.
	FamilyDeepSeekV4
)

func (f Family) String() string {
	switch f {
	case FamilyQwen3:
		return "qwen3"
	case FamilyQwen35:
		return "qwen35"
	case FamilyDeepSeekV4:
		return "deepseek4"
	}
	return "unknown"
}

// DetectFamily picks the family from the template text first (it decides the
// tool-call syntax the model was taught) and from the GGUF
// general.architecture when the template says nothing.
func DetectFamily(architecture, template string) Family {
	switch {
	case strings.Contains(template, "DSML"):
		return FamilyDeepSeekV4
	case strings.Contains(template, "<function=") && strings.Contains(template, "<parameter="):
		return FamilyQwen35
	case strings.Contains(template, "<tool_call>"):
		return FamilyQwen3
	}
	arch := strings.ToLower(architecture)
	switch {
	case slices.Contains([]string{"deepseek4", "deepseek_v4", "deepseek41"}, arch):
		return FamilyDeepSeekV4
	case strings.HasPrefix(arch, "qwen35") || arch == "qwen3_5":
		return FamilyQwen35
	case strings.HasPrefix(arch, "qwen3") || strings.HasPrefix(arch, "qwen2"):
		return FamilyQwen3
	}
	return FamilyUnknown
}

// ThinkingOpen reports whether a rendered prompt ends inside a thinking
// block (Qwen3.5's "<think>\n" or DeepSeek V4's "<think>" generation
// prompt), which is what ParserOptions.ThinkingOpen wants to know.
func ThinkingOpen(prompt string) bool {
	return strings.HasSuffix(strings.TrimRight(prompt, " \t\r\n"), "<think>")
}
