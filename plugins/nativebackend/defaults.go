package nativebackend

import "strconv"

// Capacity defaults, applied when a block leaves the flag at 0.
const (
	DefaultMaxCtx         = 4096
	DefaultMaxConcurrency = 4
	// DefaultMaxTokens is also capped at half the context.
	DefaultMaxTokens = 1024
)

// Engine option defaults: the declared option's default and the value
// used when the block does not give the option are the same constant.
const (
	DefaultCacheType      = "f16"
	DefaultKVBlockSize    = 16
	DefaultThreads        = 0 // every core
	DefaultStepTokens     = 512
	DefaultDecodeHeadroom = 64
	DefaultPrefixSlots    = 0
)

func itoa(n int) string { return strconv.Itoa(n) }

// OrDefault is v when positive, else def.
func OrDefault(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}
