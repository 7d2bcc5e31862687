//go:build tools

// Package tools pins the command packages this module builds, so `go mod tidy` keeps them.
package tools
