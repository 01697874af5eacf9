package engine

import (
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
)

func TestCoalesce(t *testing.T) {
	call := []sdk.ToolCallDelta{{Index: 0, ID: "c", Name: "f"}}
	fin := &sdk.Finish{Reason: sdk.FinishStop}
	for _, tc := range []struct {
		name string
		in   []sdk.Event
		want []sdk.Event
	}{
		{"one", []sdk.Event{{Text: "a", TokenIDs: []int32{1}}}, []sdk.Event{{Text: "a", TokenIDs: []int32{1}}}},
		{"text runs merge",
			[]sdk.Event{{Text: "a", TokenIDs: []int32{1}}, {Text: "b", TokenIDs: []int32{2}}, {Text: "c", TokenIDs: []int32{3}, Finish: fin}},
			[]sdk.Event{{Text: "abc", TokenIDs: []int32{1, 2, 3}, Finish: fin}}},
		{"reasoning then text merge",
			[]sdk.Event{{Reasoning: "r", TokenIDs: []int32{1}}, {Text: "t", TokenIDs: []int32{2}}},
			[]sdk.Event{{Reasoning: "r", Text: "t", TokenIDs: []int32{1, 2}}}},
		{"reasoning after text stays apart",
			[]sdk.Event{{Text: "t", TokenIDs: []int32{1}}, {Reasoning: "r", TokenIDs: []int32{2}}},
			[]sdk.Event{{Text: "t", TokenIDs: []int32{1}}, {Reasoning: "r", TokenIDs: []int32{2}}}},
		{"text after a call stays apart",
			[]sdk.Event{{ToolCalls: call, TokenIDs: []int32{1}}, {Text: "t", TokenIDs: []int32{2}}},
			[]sdk.Event{{ToolCalls: call, TokenIDs: []int32{1}}, {Text: "t", TokenIDs: []int32{2}}}},
		{"nothing after finish",
			[]sdk.Event{{Text: "a", Finish: fin}, {Text: "b"}},
			[]sdk.Event{{Text: "a", Finish: fin}, {Text: "b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			is.Equal(coalesce(tc.in), tc.want)
		})
	}
}
