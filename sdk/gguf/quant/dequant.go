package quant

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/dflash/dflash_server/sdk/gguf"
)

const qkK = 256 // K-quant super-block size

type dequantFunc func(block []byte, out []float32)

var dequantizers = map[gguf.Type]dequantFunc{
	gguf.F32:    func(b []byte, y []float32) { y[0] = math.Float32frombits(binary.LittleEndian.Uint32(b)) },
	gguf.F16:    func(b []byte, y []float32) { y[0] = F16ToF32(binary.LittleEndian.Uint16(b)) },
	gguf.BF16:   func(b []byte, y []float32) { y[0] = BF16ToF32(binary.LittleEndian.Uint16(b)) },
	gguf.F64:    func(b []byte, y []float32) { y[0] = float32(math.Float64frombits(binary.LittleEndian.Uint64(b))) },
	gguf.I8:     func(b []byte, y []float32) { y[0] = float32(int8(b[0])) },
	gguf.I16:    func(b []byte, y []float32) { y[0] = float32(int16(binary.LittleEndian.Uint16(b))) },
	gguf.I32:    func(b []byte, y []float32) { y[0] = float32(int32(binary.LittleEndian.Uint32(b))) },
	gguf.Q4_0:   dequantQ4_0,
	gguf.Q4_1:   dequantQ4_1,
	gguf.Q5_0:   dequantQ5_0,
	gguf.Q5_1:   dequantQ5_1,
	gguf.Q8_0:   dequantQ8_0,
	gguf.IQ4_NL: dequantIQ4NL,
	gguf.MXFP4:  dequantMXFP4,
	gguf.Q2_K:   dequantQ2_K,
	gguf.Q3_K:   dequantQ3_K,
	gguf.Q4_K:   dequantQ4_K,
	gguf.Q5_K:   dequantQ5_K,
	gguf.Q6_K:   dequantQ6_K,
	gguf.Q8_K:   dequantQ8_K,
}

// CanDequantize reports whether Dequantize supports t.
func CanDequantize(t gguf.Type) bool { return dequantizers[t] != nil }

// Dequantize decodes len(dst) elements of type t from src. len(dst) must be
// a multiple of t's block size and src must hold at least t.RowSize(len(dst))
// bytes.
func Dequantize(t gguf.Type, src []byte, dst []float32) error {
	fn := dequantizers[t]
	if fn == nil {
		return fmt.Errorf("dequantizing %s is not supported", t)
	}
	if err := checkBlocks("dequantize", t, len(dst), len(src)); err != nil {
		return err
	}
	bs, ts := t.BlockSize(), t.TypeSize()
	nb := len(dst) / bs
	le := binary.LittleEndian
	switch t { // plain types without a call per element
	case gguf.F32:
		for i := range dst {
			dst[i] = math.Float32frombits(le.Uint32(src[4*i:]))
		}
		return nil
	case gguf.F16:
		for i := range dst {
			dst[i] = F16ToF32(le.Uint16(src[2*i:]))
		}
		return nil
	case gguf.BF16:
		for i := range dst {
			dst[i] = BF16ToF32(le.Uint16(src[2*i:]))
		}
		return nil
	}
	for i := 0; i < nb; i++ {
		fn(src[i*ts:(i+1)*ts], dst[i*bs:(i+1)*bs])
	}
	return nil
}

// checkBlocks checks that elems elements are whole blocks of t and that
// the packed side of op has the bytes they take.
func checkBlocks(op string, t gguf.Type, elems, packed int) error {
	bs, ts := t.BlockSize(), t.TypeSize()
	if elems%bs != 0 {
		return fmt.Errorf("%s %s: %d elements is not a multiple of the block size %d", op, t, elems, bs)
	}
	if need := elems / bs * ts; packed < need {
		return fmt.Errorf("%s %s: %d elements need %d bytes, have %d", op, t, elems, need, packed)
	}
	return nil
}

// ToFloat32 decodes a whole byte slice of type t.
func ToFloat32(t gguf.Type, src []byte) ([]float32, error) {
	if !t.Valid() {
		return nil, fmt.Errorf("dequantizing %s is not supported", t)
	}
	if len(src)%t.TypeSize() != 0 {
		return nil, fmt.Errorf("dequantize %s: %d bytes is not a whole number of %d-byte blocks", t, len(src), t.TypeSize())
	}
	out := make([]float32, len(src)/t.TypeSize()*t.BlockSize())
	return out, Dequantize(t, src, out)
}

func half(b []byte) float32 { return F16ToF32(binary.LittleEndian.Uint16(b)) }

func dequantQ4_0(b []byte, y []float32) {
	d, qs := half(b), b[2:18]
	for j := 0; j < 16; j++ {
		y[j] = float32(int(qs[j]&0x0f)-8) * d
		y[j+16] = float32(int(qs[j]>>4)-8) * d
	}
}

func dequantQ4_1(b []byte, y []float32) {
	d, m, qs := half(b), half(b[2:]), b[4:20]
	for j := 0; j < 16; j++ {
		y[j] = float32(float32(qs[j]&0x0f)*d) + m
		y[j+16] = float32(float32(qs[j]>>4)*d) + m
	}
}

func dequantQ5_0(b []byte, y []float32) {
	d, qh, qs := half(b), binary.LittleEndian.Uint32(b[2:]), b[6:22]
	for j := 0; j < 16; j++ {
		h0 := byte(qh>>j) & 1 << 4
		h1 := byte(qh>>(j+16)) & 1 << 4
		y[j] = float32(int(qs[j]&0x0f|h0)-16) * d
		y[j+16] = float32(int(qs[j]>>4|h1)-16) * d
	}
}

func dequantQ5_1(b []byte, y []float32) {
	d, m, qh, qs := half(b), half(b[2:]), binary.LittleEndian.Uint32(b[4:]), b[8:24]
	for j := 0; j < 16; j++ {
		h0 := byte(qh>>j) & 1 << 4
		h1 := byte(qh>>(j+16)) & 1 << 4
		y[j] = float32(float32(qs[j]&0x0f|h0)*d) + m
		y[j+16] = float32(float32(qs[j]>>4|h1)*d) + m
	}
}

func dequantQ8_0(b []byte, y []float32) {
	d := half(b)
	for j := 0; j < 32; j++ {
		y[j] = float32(int8(b[2+j])) * d
	}
}

var iq4nlValues = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

func dequantIQ4NL(b []byte, y []float32) {
	d, qs := half(b), b[2:18]
	for j := 0; j < 16; j++ {
		y[j] = d * float32(iq4nlValues[qs[j]&0x0f])
		y[j+16] = d * float32(iq4nlValues[qs[j]>>4])
	}
}

// E2M1 values doubled; the scale carries the compensating half.
var mxfp4Values = [16]int8{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

func dequantMXFP4(b []byte, y []float32) {
	d := float32(math.Ldexp(1, int(b[0])-128))
	qs := b[1:17]
	for j := 0; j < 16; j++ {
		y[j] = float32(mxfp4Values[qs[j]&0x0f]) * d
		y[j+16] = float32(mxfp4Values[qs[j]>>4]) * d
	}
}

// scaleMinK4 unpacks sub-block j's 6-bit scale and min (Q4_K, Q5_K).
func scaleMinK4(j int, s []byte) (sc, m byte) {
	if j < 4 {
		return s[j] & 63, s[j+4] & 63
	}
	return s[j+4]&0x0f | (s[j-4]>>6)<<4, s[j+4]>>4 | (s[j]>>6)<<4
}

// Q2_K: 16 sub-blocks of 16 with 4-bit scale (low nibble) and min (high
// nibble); 2-bit codes, four per byte. Each 128-element half reads 32 code
// bytes at shifts 0, 2, 4, 6, and each shift covers two sub-blocks (code
// bytes 0..15 and 16..31).
func dequantQ2_K(b []byte, y []float32) {
	scales, q, d, dmin := b[0:16], b[16:80], half(b[80:]), half(b[82:])
	is := 0
	for n := 0; n < qkK; n += 128 {
		for j := 0; j < 4; j++ {
			shift := uint(2 * j)
			for h := 0; h < 2; h++ {
				sc := scales[is]
				is++
				dl, ml := d*float32(sc&0x0f), dmin*float32(sc>>4)
				for l := 0; l < 16; l++ {
					y[n+32*j+16*h+l] = float32(dl*float32((q[16*h+l]>>shift)&3)) - ml
				}
			}
		}
		q = q[32:]
	}
}

// Q3_K: 16 sub-blocks of 16 with 6-bit signed scales (offset 32) packed in
// 12 bytes; 2 low bits per element as in Q2_K, plus a high bit in hmask
// (bit clear means subtract 4).
func dequantQ3_K(b []byte, y []float32) {
	hm, q, raw, d := b[0:32], b[32:96], b[96:108], half(b[108:])
	// Unpack the scales: low nibbles from bytes 0..7, high 2 bits from 8..11.
	var sc [16]int
	for i := 0; i < 16; i++ {
		var low byte
		if i < 8 {
			low = raw[i] & 0x0f
		} else {
			low = raw[i-8] >> 4
		}
		high := (raw[8+i%4] >> (2 * uint(i/4))) & 3
		sc[i] = int(low|high<<4) - 32
	}
	is := 0
	m := byte(1)
	for n := 0; n < qkK; n += 128 {
		for j := 0; j < 4; j++ {
			shift := uint(2 * j)
			for h := 0; h < 2; h++ {
				dl := d * float32(sc[is])
				is++
				for l := 0; l < 16; l++ {
					v := int((q[16*h+l] >> shift) & 3)
					if hm[16*h+l]&m == 0 {
						v -= 4
					}
					y[n+32*j+16*h+l] = dl * float32(v)
				}
			}
			m <<= 1
		}
		q = q[32:]
	}
}

func dequantQ4_K(b []byte, y []float32) {
	d, dmin, scales, q := half(b), half(b[2:]), b[4:16], b[16:144]
	for j, is := 0, 0; j < qkK; j, is = j+64, is+2 {
		sc, m := scaleMinK4(is, scales)
		d1, m1 := d*float32(sc), dmin*float32(m)
		sc, m = scaleMinK4(is+1, scales)
		d2, m2 := d*float32(sc), dmin*float32(m)
		for l := 0; l < 32; l++ {
			y[j+l] = float32(d1*float32(q[l]&0x0f)) - m1
			y[j+32+l] = float32(d2*float32(q[l]>>4)) - m2
		}
		q = q[32:]
	}
}

func dequantQ5_K(b []byte, y []float32) {
	d, dmin, scales, qh, ql := half(b), half(b[2:]), b[4:16], b[16:48], b[48:176]
	u1, u2 := byte(1), byte(2)
	for j, is := 0, 0; j < qkK; j, is = j+64, is+2 {
		sc, m := scaleMinK4(is, scales)
		d1, m1 := d*float32(sc), dmin*float32(m)
		sc, m = scaleMinK4(is+1, scales)
		d2, m2 := d*float32(sc), dmin*float32(m)
		for l := 0; l < 32; l++ {
			lo, hi := ql[l]&0x0f, ql[l]>>4
			if qh[l]&u1 != 0 {
				lo += 16
			}
			if qh[l]&u2 != 0 {
				hi += 16
			}
			y[j+l] = float32(d1*float32(lo)) - m1
			y[j+32+l] = float32(d2*float32(hi)) - m2
		}
		ql = ql[32:]
		u1 <<= 2
		u2 <<= 2
	}
}

func dequantQ6_K(b []byte, y []float32) {
	ql, qh, sc, d := b[0:128], b[128:192], b[192:208], half(b[208:])
	for n := 0; n < qkK; n += 128 {
		for l := 0; l < 32; l++ {
			is := l / 16
			q1 := int(ql[l]&0x0f|(qh[l]>>0&3)<<4) - 32
			q2 := int(ql[l+32]&0x0f|(qh[l]>>2&3)<<4) - 32
			q3 := int(ql[l]>>4|(qh[l]>>4&3)<<4) - 32
			q4 := int(ql[l+32]>>4|(qh[l]>>6&3)<<4) - 32
			y[n+l] = float32(d*float32(int8(sc[is]))) * float32(q1)
			y[n+l+32] = float32(d*float32(int8(sc[is+2]))) * float32(q2)
			y[n+l+64] = float32(d*float32(int8(sc[is+4]))) * float32(q3)
			y[n+l+96] = float32(d*float32(int8(sc[is+6]))) * float32(q4)
		}
		ql, qh, sc = ql[64:], qh[32:], sc[8:]
	}
}

func dequantQ8_K(b []byte, y []float32) {
	d := math.Float32frombits(binary.LittleEndian.Uint32(b))
	for j := 0; j < qkK; j++ {
		y[j] = d * float32(int8(b[4+j]))
	}
}
