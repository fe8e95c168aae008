package ports

// Test hooks.
var (
	FreeWith = free
	Below    = below
	ParseLow = parseLow
	EphLow   = ephemeralLow
	Attempts = attempts
)
