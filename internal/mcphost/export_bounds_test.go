package mcphost

// SetNotificationQueueCap sets the per-session notification queue cap until the returned
// function restores it.
func SetNotificationQueueCap(n int) (restore func()) {
	old := notificationQueueCap
	notificationQueueCap = n
	return func() { notificationQueueCap = old }
}

// SetUpdatesInFlight sets the bound on notification updates in flight of sessions opened from
// now on until the returned function restores it.
func SetUpdatesInFlight(n int) (restore func()) {
	old := updatesInFlight
	updatesInFlight = n
	return func() { updatesInFlight = old }
}

// WaitingForSlot returns how many deliveries of the session wait for a free update slot.
func (c *Conn) WaitingForSlot() int64 { return c.slotWaits.Load() }

// QueueState returns how many notifications wait in the session's queue and how many the
// pending overflow stands for.
func (c *Conn) QueueState() (queued int, dropped int64) {
	c.nmu.Lock()
	defer c.nmu.Unlock()
	return len(c.queue), c.overflow.dropped
}
