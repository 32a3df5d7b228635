// traced's reason for ending a tracing session, which the Perfetto C SDK
// (perfetto-sdk-sys 1.4.0) does not pass on: its C API wraps a
// perfetto::TracingSession* (PerfettoTracingSessionSystemCreate returns
// one, cast) but has no PerfettoTracingSessionSetErrorCb. The C++ API's
// SetOnErrorCallback gets the error traced sent with OnTracingDisabled
// ("A trace with this unique session name already exists", a config it
// rejects) or the disconnection.
//
// The declarations below repeat, in order, the virtual functions of
// perfetto::TracingSession up to SetOnErrorCallback and the layout of
// perfetto::TracingError, as the amalgamated SDK of the pinned
// perfetto-sdk-sys (=1.4.0, libperfetto_c/perfetto_c.cc) declares them:
// the call goes through the object's own vtable, so only the slot order
// (Itanium C++ ABI: the virtual destructor takes two) and the argument
// layout must match. Bumping perfetto-sdk-sys means checking them again.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace perfetto {

class TraceConfig;

struct TracingError {
  enum ErrorCode : uint32_t {
    kDisconnected = 1,
    kTracingFailed = 2,
  };
  ErrorCode code;
  std::string message;
};

class TracingSession {
 public:
  struct CloneTraceCallbackArgs;
  struct CloneTraceArgs;
  virtual ~TracingSession();
  virtual void Setup(const TraceConfig&, int fd) = 0;
  virtual void Start() = 0;
  virtual void StartBlocking() = 0;
  virtual void CloneTrace(CloneTraceArgs*,
                          std::function<void(CloneTraceCallbackArgs*)>);
  virtual void SetOnStartCallback(std::function<void()>) = 0;
  virtual void SetOnErrorCallback(std::function<void(TracingError)>) = 0;
};

}  // namespace perfetto

struct PerfettoTracingSessionImpl;

typedef void (*VitalsSessionErrorCb)(void* user_arg,
                                     uint32_t code,
                                     const char* message,
                                     size_t len);

// Before Setup/Start: `cb` runs at most once, on the SDK's thread, with
// traced's message (not NUL-terminated, `len` bytes, valid during the
// call).
extern "C" void VitalsPerfettoTracingSessionSetErrorCb(
    struct PerfettoTracingSessionImpl* session,
    VitalsSessionErrorCb cb,
    void* user_arg) {
  auto* ts = reinterpret_cast<perfetto::TracingSession*>(session);
  ts->SetOnErrorCallback([cb, user_arg](perfetto::TracingError e) {
    cb(user_arg, static_cast<uint32_t>(e.code), e.message.data(),
       e.message.size());
  });
}
