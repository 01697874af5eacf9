package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/dflash/dflash_server/sdk/gguf/quant"
	"github.com/dflash/dflash_server/sdk/tokenizer"
)

// outputTypes are the --type values convert and mk accept, with the
// general.file_type (llama.cpp LlamaFileType) each one writes.
var outputTypes = map[string]struct {
	typ      gguf.Type
	fileType uint32
}{
	"f32":  {gguf.F32, 0},
	"f16":  {gguf.F16, 1},
	"bf16": {gguf.BF16, 32},
	"q8_0": {gguf.Q8_0, 7},
	"q4_0": {gguf.Q4_0, 2},
	"q4_K": {gguf.Q4_K, 14}, // Q4_K_S: Q4_K, with output.weight in Q6_K
	"q6_K": {gguf.Q6_K, 18},
}

func outputTypeNames() string {
	var names []string
	for n := range outputTypes {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func parseOutputType(s string) (gguf.Type, uint32, error) {
	for n, t := range outputTypes {
		if strings.EqualFold(n, s) {
			return t.typ, t.fileType, nil
		}
	}
	return 0, 0, fmt.Errorf("unsupported output type %q (supported: %s)", s, outputTypeNames())
}

// fallbackType is used when a tensor's rows are not a whole number of the
// wanted type's blocks.
var fallbackType = map[gguf.Type]gguf.Type{
	gguf.Q4_K: gguf.Q8_0,
	gguf.Q6_K: gguf.Q8_0,
	gguf.Q8_0: gguf.F16,
	gguf.Q4_0: gguf.F16,
}

// chooseType picks a tensor's stored type: 1-D tensors and those marked F32
// stay F32 (as llama.cpp's converter does), the head gets Q6_K in a Q4_K
// file, and rows that do not divide into blocks fall back to a finer type.
func chooseType(p tensorPlan, want gguf.Type) gguf.Type {
	if p.I32 {
		return gguf.I32
	}
	if p.F32 || len(p.Dims) < 2 {
		return gguf.F32
	}
	t := want
	if p.Half && want.Quantized() {
		t = gguf.F16
	}
	if want == gguf.Q4_K && p.Name == "output.weight" {
		t = gguf.Q6_K
	}
	for p.Dims[0]%uint64(t.BlockSize()) != 0 {
		t = fallbackType[t]
	}
	return t
}

// isExpertStack tells the routed expert stacks (3-D, "*_exps.weight") from the other matrices.
func isExpertStack(p tensorPlan) bool {
	return len(p.Dims) == 3 && strings.HasSuffix(p.Name, "_exps.weight")
}

// rowFunc fills dst with one row (ne0 values) of a tensor. It is called
// concurrently for different rows.
type rowFunc func(row int, dst []float32) error

// modelFile is everything written into one GGUF file.
type modelFile struct {
	arch     string
	name     string
	fileType uint32
	want     gguf.Type
	// expertWant, when set, is the wanted type of the routed expert stacks (3-D "*_exps.weight" tensors) instead of want.
	expertWant *gguf.Type
	keys       []kv           // architecture keys
	tok        map[string]any // tokenizer keys
	plans      []tensorPlan
	// rows opens a tensor's row source.
	rows func(p tensorPlan) (rowFunc, error)
	// distinctRows, when positive, caps the rows drawn and quantized per
	// tensor: later rows repeat the bytes of one of the first distinctRows
	// (mk --distinct-rows).
	distinctRows int
}

// write streams the model to path (through a temporary file that is renamed
// into place, so a failed run leaves nothing half-written), one row at a
// time. It reports per-tensor progress to log when log is not nil.
func (m *modelFile) write(path string, log io.Writer) (err error) {
	tmp := path + ".tmp"
	w, err := gguf.Create(tmp)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = w.Close()
			_ = os.Remove(tmp)
		}
	}()
	types := make([]gguf.Type, len(m.plans))
	quantized := false
	for i, p := range m.plans {
		want := m.want
		if m.expertWant != nil && isExpertStack(p) {
			want = *m.expertWant
		}
		types[i] = chooseType(p, want)
		quantized = quantized || types[i].Quantized()
	}
	keys := []kv{{gguf.KeyArchitecture, m.arch}, {"general.type", "model"}}
	if m.name != "" {
		keys = append(keys, kv{"general.name", m.name})
	}
	keys = append(keys, kv{"general.file_type", m.fileType})
	if quantized {
		keys = append(keys, kv{"general.quantization_version", uint32(2)})
	}
	keys = append(keys, m.keys...)
	// An architecture key wins over the tokenizer's (a draft's mask token
	// id may also be in the tokenizer copied from its target).
	archKey := map[string]bool{}
	for _, k := range m.keys {
		archKey[k.key] = true
	}
	tokKeys := make([]string, 0, len(m.tok))
	for k := range m.tok {
		if !archKey[k] {
			tokKeys = append(tokKeys, k)
		}
	}
	sort.Strings(tokKeys)
	for _, k := range tokKeys {
		keys = append(keys, kv{k, m.tok[k]})
	}
	for _, k := range keys {
		if err := w.AddKV(k.key, k.val); err != nil {
			return err
		}
	}
	for i, p := range m.plans {
		if err := w.AddTensor(p.Name, types[i], p.Dims); err != nil {
			return err
		}
	}
	for i, p := range m.plans {
		if log != nil {
			fmt.Fprintf(log, "[%*d/%d] %-40s %-5s %v\n", len(fmt.Sprint(len(m.plans))), i+1, len(m.plans), p.Name, types[i], p.Dims)
		}
		rows, err := m.rows(p)
		if err != nil {
			return err
		}
		if err := writeRows(w, p, types[i], rows, m.distinctRows); err != nil {
			return err
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// writeRows quantizes and writes a tensor row by row. Large tensors are
// filled and quantized by GOMAXPROCS workers, a wave of row chunks at a
// time, and written in order. With distinct > 0 only the first distinct rows
// are drawn and quantized; each later row repeats one of them, picked by a
// hash of its index.
func writeRows(w *gguf.Writer, p tensorPlan, t gguf.Type, rows rowFunc, distinct int) error {
	ne0 := int(p.Dims[0])
	n := 1
	for _, d := range p.Dims[1:] {
		n *= int(d)
	}
	rowBytes := int(t.RowSize(uint64(ne0)))
	chunk := max(1, (1<<20)/ne0) // rows per chunk: about a million values
	workers := runtime.GOMAXPROCS(0)
	if n*ne0 < 1<<22 {
		workers = 1
	}
	bufs := make([][]byte, workers)
	for i := range bufs {
		bufs[i] = make([]byte, min(chunk, n)*rowBytes)
	}
	// fillChunk fills and quantizes rows [r0, r1) into buf.
	fillChunk := func(r0, r1 int, buf []byte) error {
		vals := make([]float32, ne0)
		for r := r0; r < r1; r++ {
			if err := rows(r, vals); err != nil {
				return err
			}
			if err := quant.Quantize(t, vals, buf[(r-r0)*rowBytes:(r-r0+1)*rowBytes]); err != nil {
				return err
			}
		}
		return nil
	}
	if distinct > 0 && n > distinct {
		pool := make([]byte, distinct*rowBytes)
		if err := fillPool(distinct, chunk, workers, rowBytes, pool, fillChunk); err != nil {
			return err
		}
		fillChunk = func(r0, r1 int, buf []byte) error {
			for r := r0; r < r1; r++ {
				src := r
				if r >= distinct {
					src = int((uint64(r) * 0x9e3779b97f4a7c15 >> 17) % uint64(distinct))
				}
				copy(buf[(r-r0)*rowBytes:(r-r0+1)*rowBytes], pool[src*rowBytes:(src+1)*rowBytes])
			}
			return nil
		}
	}
	return w.WriteTensor(p.Name, func(tw io.Writer) error {
		for start := 0; start < n; start += chunk * workers {
			var wg sync.WaitGroup
			errs := make([]error, workers)
			ends := make([]int, workers)
			for k := 0; k < workers; k++ {
				r0 := start + k*chunk
				r1 := min(r0+chunk, n)
				ends[k] = max(r1-r0, 0)
				if r0 >= n {
					break
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[k] = fillChunk(r0, r1, bufs[k])
				}()
			}
			wg.Wait()
			for k := 0; k < workers; k++ {
				if errs[k] != nil {
					return errs[k]
				}
				if _, err := tw.Write(bufs[k][:ends[k]*rowBytes]); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// fillPool fills rows [0, n) into pool with fill, chunk rows a call, by up
// to workers goroutines at once.
func fillPool(n, chunk, workers, rowBytes int, pool []byte, fill func(r0, r1 int, buf []byte) error) error {
	var wg sync.WaitGroup
	sem := make(chan struct{}, workers)
	errs := make([]error, (n+chunk-1)/chunk)
	for i, r0 := 0, 0; r0 < n; i, r0 = i+1, r0+chunk {
		r1 := min(r0+chunk, n)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			errs[i] = fill(r0, r1, pool[r0*rowBytes:r1*rowBytes])
			<-sem
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// hfTokenizer turns a Hugging Face tokenizer (a tokenizer.json file or the
// folder holding it) into GGUF tokenizer metadata.
var hfTokenizer = tokenizer.HFMetadata

// tokenizerFor reads tokenizer metadata and makes its vocabulary exactly
// vocab tokens long (vocab 0 keeps the tokenizer's size), padding with
// unused [PAD{id}] entries as llama.cpp's converter does. It returns the
// final vocabulary size.
func tokenizerFor(path string, vocab int) (map[string]any, int, error) {
	md, err := hfTokenizer(path)
	if err != nil {
		return nil, 0, fmt.Errorf("tokenizer %s: %w", path, err)
	}
	tokens, ok := md["tokenizer.ggml.tokens"].([]string)
	if !ok {
		return nil, 0, fmt.Errorf("tokenizer %s: no tokenizer.ggml.tokens", path)
	}
	if vocab == 0 {
		return md, len(tokens), nil
	}
	if vocab < len(tokens) {
		return nil, 0, fmt.Errorf("vocab size %d is smaller than the tokenizer's %d tokens", vocab, len(tokens))
	}
	types, _ := md["tokenizer.ggml.token_type"].([]int32)
	if len(types) != len(tokens) {
		return nil, 0, fmt.Errorf("tokenizer %s: %d token types for %d tokens", path, len(types), len(tokens))
	}
	for i := len(tokens); i < vocab; i++ {
		tokens = append(tokens, fmt.Sprintf("[PAD%d]", i))
		types = append(types, 5) // UNUSED
	}
	md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"] = tokens, types
	return md, vocab, nil
}
