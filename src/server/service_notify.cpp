#include "server/service_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace clefrt::server {

bool notify_service_manager(const char* state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (!path || !*path) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t n = std::strlen(path);
  if (n >= sizeof addr.sun_path) return false;
  std::memcpy(addr.sun_path, path, n);
  if (path[0] == '@') addr.sun_path[0] = '\0';  // an abstract socket
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const socklen_t len = socklen_t(offsetof(sockaddr_un, sun_path) + n);
  const bool sent = sendto(fd, state, std::strlen(state), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&addr), len) >= 0;
  close(fd);
  return sent;
}

}  // namespace clefrt::server
