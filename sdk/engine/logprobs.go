package engine

import (
	"math"

	"github.com/dflash/dflash_server/sdk"
)

// maxTopLogprobs bounds the alternatives per token (OpenAI allows 20).
const maxTopLogprobs = 20

// tokenLogprob is the log-softmax of tok in row and the top alternatives.
func tokenLogprob(row []float32, tok int32, top int, vocab Vocab) sdk.TokenLogprob {
	mx := float32(math.Inf(-1))
	for _, v := range row {
		mx = max(mx, v)
	}
	var sum float64
	for _, v := range row {
		sum += math.Exp(float64(v - mx))
	}
	lse := float64(mx) + math.Log(sum)
	lp := tokenEntry(vocab, tok, float64(row[tok])-lse)
	top = min(top, maxTopLogprobs, len(row))
	if top <= 0 {
		return lp
	}
	// Insertion into a small sorted list: top is at most 20.
	ids := make([]int32, 0, top)
	for i, v := range row {
		if len(ids) == top && v <= row[ids[top-1]] {
			continue
		}
		j := len(ids)
		if j < top {
			ids = append(ids, 0)
		} else {
			j = top - 1
		}
		for j > 0 && row[ids[j-1]] < v {
			ids[j] = ids[j-1]
			j--
		}
		ids[j] = int32(i)
	}
	for _, id := range ids {
		lp.Top = append(lp.Top, topEntry(vocab, id, float64(row[id])-lse))
	}
	return lp
}

// topEntry is token id's text and log-probability; tokenEntry the same for a generated token.
func topEntry(vocab Vocab, id int32, logprob float64) sdk.TopLogprob {
	b := vocab.TokenBytes(id)
	return sdk.TopLogprob{Token: string(b), Bytes: b, Logprob: logprob}
}

func tokenEntry(vocab Vocab, id int32, logprob float64) sdk.TokenLogprob {
	t := topEntry(vocab, id, logprob)
	return sdk.TokenLogprob{Token: t.Token, Bytes: t.Bytes, Logprob: t.Logprob}
}

// candidateLogprob is tokenLogprob from a row's best candidates and its log-sum-exp (the candidates cover the top
// alternatives, fromCandidates, and the chosen token, or drawCandidate recorded its logit).
func candidateLogprob(c *candidateRow, tok int32, top int, vocab Vocab) sdk.TokenLogprob {
	lp := tokenEntry(vocab, tok, math.Inf(-1))
	if c.drawnSet && c.drawn == tok { // drawn from the whole row: it may lie outside the candidates
		lp.Logprob = float64(c.drawnLogit) - float64(c.lse)
	}
	for j, id := range c.ids {
		if id == tok {
			lp.Logprob = float64(c.logits[j]) - float64(c.lse)
			break
		}
	}
	top = min(top, maxTopLogprobs)
	for j, id := range c.ids {
		if len(lp.Top) == top || id < 0 {
			break
		}
		lp.Top = append(lp.Top, topEntry(vocab, id, float64(c.logits[j])-float64(c.lse)))
	}
	return lp
}
