package ledger

// SetEnsureLookupHook sets a function EnsureSubscription runs between its upsert and its
// look-up of an existing row; it returns a function that removes it.
func SetEnsureLookupHook(f func()) func() {
	testHookEnsureLookup = f
	return func() { testHookEnsureLookup = nil }
}
