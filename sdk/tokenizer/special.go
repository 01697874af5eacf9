package tokenizer

import (
	"cmp"
	"slices"
	"strings"
)

type specialEntry struct {
	text    string
	id      int32
	control bool // matched only when parsing specials
}

// specialMatcher finds special-token texts in input: at each position the
// longest matching text wins, scanning left to right (the Hugging Face
// added-token split).
type specialMatcher struct {
	first     [256]bool  // bytes that start some text
	single    [256]int32 // one-byte texts: id+1, 0 if none
	singleCtl [256]bool
	multi     map[uint16][]specialEntry // by first two bytes, longest first
}

func newSpecialMatcher(entries []specialEntry) specialMatcher {
	m := specialMatcher{multi: map[uint16][]specialEntry{}}
	for _, e := range entries {
		m.first[e.text[0]] = true
		if len(e.text) == 1 {
			m.single[e.text[0]] = e.id + 1
			m.singleCtl[e.text[0]] = e.control
			continue
		}
		k := uint16(e.text[0])<<8 | uint16(e.text[1])
		m.multi[k] = append(m.multi[k], e)
	}
	for _, list := range m.multi {
		slices.SortStableFunc(list, func(a, b specialEntry) int { return cmp.Compare(len(b.text), len(a.text)) })
	}
	return m
}

// match returns the special token starting s, if any.
func (m *specialMatcher) match(s string, parseSpecial bool) (id int32, n int, ok bool) {
	if len(s) >= 2 {
		for _, e := range m.multi[uint16(s[0])<<8|uint16(s[1])] {
			if (parseSpecial || !e.control) && strings.HasPrefix(s, e.text) {
				return e.id, len(e.text), true
			}
		}
	}
	if v := m.single[s[0]]; v != 0 && (parseSpecial || !m.singleCtl[s[0]]) {
		return v - 1, 1, true
	}
	return 0, 0, false
}

// partition calls onText for each stretch of text between special tokens
// and onSpecial for each special token, in order.
func (m *specialMatcher) partition(s string, parseSpecial bool, onText func(string), onSpecial func(int32)) {
	start := 0
	for i := 0; i < len(s); i++ {
		if !m.first[s[i]] {
			continue
		}
		id, n, ok := m.match(s[i:], parseSpecial)
		if !ok {
			continue
		}
		if start < i {
			onText(s[start:i])
		}
		onSpecial(id)
		i += n - 1
		start = i + 1
	}
	if start < len(s) {
		onText(s[start:])
	}
}
