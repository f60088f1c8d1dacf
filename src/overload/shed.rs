//! Why a call was answered without being served: the reasons shedding gives, each a label of
//! `floodgate_shed_total`.

/// Why a call was answered without being served (the `reason` of `floodgate_shed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedReason {
    /// Its deadline leaves less than its wait so far.
    Deadline,
    /// It has no deadline and waited in a standing queue longer than the target.
    Queue,
    /// Its connection holds more than its fair share of the calls in flight.
    FairShare,
    /// The backend's queue could not serve it before its deadline.
    Backlog,
}

impl ShedReason {
    /// Every reason, for metric labels.
    pub const ALL: [ShedReason; 4] = [
        ShedReason::Deadline,
        ShedReason::Queue,
        ShedReason::FairShare,
        ShedReason::Backlog,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ShedReason::Deadline => "deadline",
            ShedReason::Queue => "queue",
            ShedReason::FairShare => "fair_share",
            ShedReason::Backlog => "backlog",
        }
    }
}
