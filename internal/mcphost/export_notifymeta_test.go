package mcphost

// StampNotificationVersion exposes stampNotificationVersion to the external tests.
var StampNotificationVersion = stampNotificationVersion
