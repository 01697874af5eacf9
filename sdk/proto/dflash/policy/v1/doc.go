// Package policyv1 is the generated Go code of the dflash.policy.v1 plugin
// protocol (policy.proto); regenerate it with make proto.
package policyv1
