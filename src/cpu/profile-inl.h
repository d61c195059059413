// profile-inl.h: the lap clock the work items read between their stages (src/cpu/profile.h).
// With no profile installed a lap is one test of a pointer.

class StageClock {
 public:
  StageClock() : profile_(active_stage_profile()) {
    if (profile_ != nullptr) last_ = stage_clock_ns();
  }
  // The time since the previous lap (or the clock's start) goes to `stage`.
  void lap(Stage stage) {
    if (profile_ == nullptr) return;
    const std::int64_t now = stage_clock_ns();
    add_stage_time(profile_, stage, now - last_);
    last_ = now;
  }

 private:
  StageProfile* profile_;
  std::int64_t last_ = 0;
};
