// systemd's readiness protocol (sd_notify) without libsystemd: under a Type=notify unit,
// systemd passes a datagram socket in NOTIFY_SOCKET; "READY=1" when the model has loaded makes
// `systemctl start` wait for a server that answers, "STOPPING=1" when it drains. Outside
// systemd (no NOTIFY_SOCKET) nothing is sent.
#pragma once

namespace clefrt::server {

// Sends `state` ("READY=1", "STOPPING=1", "STATUS=...") to $NOTIFY_SOCKET; false when there is
// none or the send failed (a service manager that does not listen is not an error here).
bool notify_service_manager(const char* state);

}  // namespace clefrt::server
