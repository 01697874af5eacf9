// Package server wires a launch configuration into a running dflash_server:
// it discovers and starts the plugins, loads the selected model blocks in
// parallel, builds the router and the HTTP API, serves, and drains on
// SIGTERM (readiness 503, waiters 503, active streams finish, plugins shut
// down and are killed). cmd/dflash_server is a thin main around Run.
package server
