//! One error family: every error a user can meet says what went wrong (its
//! `Display`), what to do about it (`Hinted::hint`, one signature) and what
//! kind of failure it is (`Hinted::kind`), and the exit-code rule of
//! docs/reference/exit-codes.md is applied here, once (`Kind::code`). The
//! command line turns any of them into its one `Failure` by one conversion;
//! each error type implements `Hinted` beside its definition.

/// What kind of failure, and so which exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// What the user typed or gave is wrong: exit 2.
    Usage,
    /// The machine, its files or its limits refused: exit 3.
    Environment,
    /// A node of the job was lost: exit 1.
    Lost,
    /// The user's signal N stopped it: exit 128+N.
    Signal(i32),
}

impl Kind {
    /// The exit code (docs/reference/exit-codes.md).
    pub(crate) fn code(self) -> i32 {
        match self {
            Kind::Usage => 2,
            Kind::Environment => 3,
            Kind::Lost => 1,
            Kind::Signal(n) => 128 + n,
        }
    }
}

/// An error a user meets: what to do about it, and its kind.
pub(crate) trait Hinted: std::fmt::Display {
    /// What to do about it (empty when nothing is to be done).
    fn hint(&self) -> String;
    fn kind(&self) -> Kind;
    /// The exit code it ends the command with.
    fn code(&self) -> i32 {
        self.kind().code()
    }
}
