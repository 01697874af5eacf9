// Package metrics holds dflash_server's Prometheus registry: the per-model
// serving gauges a Kubernetes inference gateway scrapes (waiting, running, KV
// cache usage), routing counters (fallbacks, rejections by reason, policy
// errors), latency histograms (queue wait, time to first token, time per
// output token) and token counters.
//
// Names follow the recommended dflash_ set (snake_case with unit suffixes,
// label "model"); with Options.VLLMCompat the three gateway gauges are also
// exported under their vLLM names with label "model_name", so a gateway
// scraping vLLM names needs no configuration.
//
// Every method is safe for concurrent use and safe on a nil *Registry, so a
// component given no registry records nothing without checks at call sites.
package metrics
