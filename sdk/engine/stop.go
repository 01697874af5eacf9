package engine

import "strings"

// stopMatcher finds stop strings in a stream of visible text that arrives in
// arbitrary pieces. Text that could still be the start of a stop string is
// held back until the next piece decides it, so a match across token
// boundaries is found and the matched string is never emitted.
type stopMatcher struct {
	stops []string
	held  string
}

func newStopMatcher(stops []string) stopMatcher {
	var s []string
	for _, x := range stops {
		if x != "" {
			s = append(s, x)
		}
	}
	return stopMatcher{stops: s}
}

// push adds text and returns what may be emitted now; when a stop string
// matched it returns the text before the match and the stop string, and the
// matcher must not be used again.
func (m *stopMatcher) push(text string) (emit, matched string) {
	if len(m.stops) == 0 {
		return text, ""
	}
	buf := m.held + text
	first, which := -1, ""
	for _, s := range m.stops {
		if i := strings.Index(buf, s); i >= 0 && (first < 0 || i < first || (i == first && len(s) > len(which))) {
			first, which = i, s
		}
	}
	if first >= 0 {
		m.held = ""
		return buf[:first], which
	}
	keep := m.partialSuffix(buf)
	m.held = buf[len(buf)-keep:]
	return buf[:len(buf)-keep], ""
}

// partialSuffix is the length of the longest suffix of buf that is a proper
// prefix of some stop string. Such a suffix starts where a stop string
// starts, so cutting there never splits a UTF-8 character of valid text.
func (m *stopMatcher) partialSuffix(buf string) int {
	best := 0
	for _, s := range m.stops {
		n := min(len(s)-1, len(buf))
		for k := n; k > best; k-- {
			if strings.HasSuffix(buf, s[:k]) {
				best = k
				break
			}
		}
	}
	return best
}

// flush returns the held-back text at the end of generation.
func (m *stopMatcher) flush() string {
	h := m.held
	m.held = ""
	return h
}
