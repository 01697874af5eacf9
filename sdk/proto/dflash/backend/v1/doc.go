// Package backendv1 is the generated Go code of the dflash.backend.v1 plugin
// protocol (backend.proto); regenerate it with make proto.
package backendv1
