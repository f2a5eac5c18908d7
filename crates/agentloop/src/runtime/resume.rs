//! The resume at start (S19, S39, S40): the stored sessions a previous run left
//! resumable are started again (or registered asleep), each on the version its record
//! allows, with a report of what was skipped and why. It runs once, from the start.

use super::*;

impl<I, E> Runtime<I, E>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// How `stored` would resume on this runtime's versions of its kind (S40); `None`
    /// for a kind not registered here (the spawn refuses it, naming the kinds).
    pub(super) fn version_plan(&self, stored: &Stored) -> Option<VersionPlan> {
        let kind = match stored {
            Stored::Current(r) => &r.header.agent_kind,
            Stored::Format1(f) => &f.agent_kind,
        };
        let kind = self.handle.kinds.get(kind)?;
        Some(crate::supervisor::versions::plan_for(
            &**kind,
            crate::supervisor::versions::version_of(stored),
        ))
    }

    /// The error for a record no version here runs.
    pub(super) fn version_refusal(
        &self,
        entry: &crate::store::StoredEntry,
        why: String,
    ) -> crate::supervisor::versions::VersionError {
        let (kind, version) = match &entry.record {
            Ok(stored) => match stored {
                Stored::Current(r) => (r.header.agent_kind.clone(), r.header.agent_version),
                Stored::Format1(f) => (
                    f.agent_kind.clone(),
                    crate::supervisor::versions::FIRST_VERSION,
                ),
            },
            Err(_) => (String::new(), 0),
        };
        let available = self
            .handle
            .kinds
            .get(&kind)
            .map(|k| crate::supervisor::versions::list(&k.versions()))
            .unwrap_or_default();
        crate::supervisor::versions::VersionError::Unavailable {
            session: entry.session_id.clone(),
            kind,
            version,
            available,
            why,
        }
    }

    /// Resumes every stored session that is `Interrupted`, or `Running` under an owner
    /// whose heartbeat is stale (S19).
    pub(super) async fn resume(&self) -> Result<StartReport, RuntimeError> {
        let mut report = StartReport::default();
        let Some(store) = &self.store else {
            return Ok(report);
        };
        let entries = store
            .list_stored(Some(vec![StatusKind::Interrupted, StatusKind::Running]))
            .await?;
        // A cluster node judges other nodes' records by membership and placement.
        let membership = match self.node {
            true => Some(
                Membership::judge(
                    &store.instances().await?,
                    &self.instance,
                    now_ms(),
                    self.lease_timeout,
                )
                .with_runs(store.advertised().await?),
            ),
            false => None,
        };
        let mut spawns = Vec::new();
        let mut sleepers = Vec::new();
        for entry in entries {
            // S40: a record this runtime cannot run is left as it is; one it must
            // migrate is loaded by its session's start once migrated (its items may not
            // read as the item type before).
            let plan = match &entry.record {
                Ok(stored) => self.version_plan(stored),
                Err(_) => None,
            };
            if let Some(VersionPlan::Refused { why }) = plan {
                let e = self.version_refusal(&entry, why);
                tracing::warn!(session = %entry.session_id, error = %e,
                    "a stored session's agent version does not run here; it is not resumed and was left untouched");
                report.skipped.push((entry.session_id, e.to_string()));
                continue;
            }
            let rec = match entry.record.and_then(|s| match (plan, s) {
                (Some(VersionPlan::Migrate { .. }), Stored::Current(r)) => Ok(Resume::Migrate(r)),
                (_, s) => s.decode::<I>().map(Resume::Loaded),
            }) {
                Ok(r) => r,
                Err(e) => {
                    // Nobody may read the report: say it where operators look (S15).
                    tracing::warn!(session = %entry.session_id, error = %e,
                        "a stored record does not decode; it is not resumed and was left untouched");
                    report.skipped.push((entry.session_id, e.to_string()));
                    continue;
                }
            };
            let h = rec.header();
            if self.node && h.owner.as_deref() != Some(self.instance.as_str()) {
                // A node resumes its own records; another's only when that node is dead
                // and placement names this one (the adoption sweep's rule).
                if !membership
                    .as_ref()
                    .is_some_and(|m| should_adopt(m, &self.instance, placed(h), h.owner.as_deref()))
                {
                    report.skipped.push((
                        h.session_id.clone(),
                        format!(
                            "owned by node `{}`, or placed on another live node; that node \
                             runs it (or adopts it when its owner's lease expires)",
                            h.owner.as_deref().unwrap_or("none")
                        ),
                    ));
                    continue;
                }
            }
            if h.status == SessionStatus::Running {
                if let Some(owner) = h.owner.as_deref().filter(|o| *o != self.instance) {
                    let beat = store.heartbeat(owner).await?;
                    // An exclusive store proves a previous process's owner gone: its
                    // sessions are recovered at once, not after its lease (issue 28).
                    let seen = crate::store::lease::last_seen(h, beat.unwrap_or(0));
                    let orphaned = store.orphaned(owner, seen);
                    // S19, judged as the session's load judges it.
                    match resumable(
                        h,
                        Some(&self.instance),
                        beat,
                        orphaned,
                        now_ms(),
                        self.lease_timeout,
                    ) {
                        Resumable::Recover { orphaned: true, .. } => {
                            tracing::info!(session = %h.session_id, owner,
                                "recovering a session of a process that held this data directory before");
                        }
                        Resumable::Held { age, left, .. } => {
                            report.skipped.push((
                                h.session_id.clone(),
                                format!(
                                    "owned by instance `{owner}`, last seen {} ago; its lease \
                                     expires in {} (lease_timeout {}): if that process is \
                                     still running, it keeps the session; if it is gone, start \
                                     again after that and the session is recovered",
                                    agentloop_core::duration_text::format_duration(age),
                                    agentloop_core::duration_text::format_duration(left),
                                    agentloop_core::duration_text::format_duration(
                                        self.lease_timeout
                                    ),
                                ),
                            ));
                            continue;
                        }
                        _ => {}
                    }
                }
            }
            // S39: asleep when its owner ended: registered asleep (claimed first on a
            // shared store), woken by the first request for it.
            if h.asleep && h.status == SessionStatus::Running {
                sleepers.push(h.clone());
                continue;
            }
            let items = rec.item_count();
            let crashed = h.status == SessionStatus::Running;
            let id = h.session_id.clone();
            // On a shared store the resume claims the record (a new owner and lease
            // epoch), so no other runtime's recovery sweep takes it for its dead
            // former owner's (issue 28).
            let spec = match rec {
                Resume::Loaded(rec) => {
                    SessionSpec::resuming(rec, self.durability, self.lease_timeout, self.sweeps)
                }
                Resume::Migrate(r) => {
                    let mut spec =
                        SessionSpec::from_header(&r.header, self.durability, self.lease_timeout);
                    spec.claim = self.sweeps;
                    spec.resumed = true;
                    spec
                }
            };
            spawns.push((id, (items, crashed), spec));
        }
        // In batches (one request per thousand sessions), whose sessions start
        // concurrently, a bounded number at a time, instead of one after the other (B5).
        let (meta, specs): (Vec<_>, Vec<_>) = spawns
            .into_iter()
            .map(|(id, items, spec)| ((id, items), spec))
            .unzip();
        let results = self.supervisor.spawn_batch(specs).await;
        for ((id, (items, crashed)), result) in meta.into_iter().zip(results) {
            match result {
                Ok(_) => {
                    report.resumed.push(id);
                    report.items += items;
                    report.recovered += usize::from(crashed);
                }
                Err(e) => report.skipped.push((id, e.to_string())),
            }
        }
        let (asleep, skipped) = register_asleep(
            &**store,
            &self.supervisor,
            &self.instance,
            sleepers,
            self.sweeps,
        )
        .await;
        report.asleep = asleep;
        for (id, why) in &skipped {
            // Nobody may read the report: say it where operators look (S15).
            tracing::warn!(session = %id, why = %why, "a sleeping session was not registered; its record is kept as it is");
        }
        report.skipped.extend(skipped);
        tracing::info!(
            resumed = report.resumed.len(),
            asleep = report.asleep,
            items = report.items,
            skipped = report.skipped.len(),
            "resumed stored sessions"
        );
        Ok(report)
    }
}

/// Registers sessions whose records say they sleep (S39) with the supervisor, without
/// starting them; with `claim`, a record another owner held (a node that died, a
/// previous process on a shared store) is claimed first: one write at the next lease
/// epoch, which exactly one claimant wins. Returns how many were registered and the
/// others with why.
pub(super) async fn register_asleep<I, E>(
    store: &dyn CheckpointStore<I>,
    supervisor: &SupervisorHandle<I, E>,
    me: &str,
    headers: Vec<crate::store::RecordHeader>,
    claim: bool,
) -> (usize, Vec<(String, String)>)
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    let mut skipped = Vec::new();
    let mut sessions = Vec::with_capacity(headers.len());
    for h in headers {
        if claim && h.owner.as_deref() != Some(me) {
            let write = crate::store::transition::hand_over(
                &h,
                Some(me.to_string()),
                SessionStatus::Running,
                now_ms(),
            );
            if let Err(e) = store.write(write).await {
                skipped.push((
                    h.session_id.clone(),
                    format!("its sleeping record could not be claimed ({e}); another instance took it, or the next sweep retries"),
                ));
                continue;
            }
        }
        sessions.push((h.session_id, h.agent_kind));
    }
    let offered = sessions.len();
    let refused = supervisor.sleepers(sessions).await;
    let registered = offered - refused.len();
    skipped.extend(refused.into_iter().map(|id| {
        (
            id,
            "its agent kind is not registered in this runtime; register it and start again \
             (the record is kept as it is)"
                .to_string(),
        )
    }));
    (registered, skipped)
}

/// A record the start resumes: decoded (its session uses it as read), or one its
/// session's start migrates first (S40) and then loads itself.
pub(super) enum Resume<I> {
    Loaded(crate::store::LoadedRecord<I>),
    Migrate(crate::store::StoredRecord),
}

impl<I> Resume<I> {
    pub(super) fn header(&self) -> &crate::store::RecordHeader {
        match self {
            Resume::Loaded(r) => &r.header,
            Resume::Migrate(r) => &r.header,
        }
    }

    pub(super) fn item_count(&self) -> usize {
        match self {
            Resume::Loaded(r) => r.item_count(),
            Resume::Migrate(r) => r.items.len(),
        }
    }
}

/// A record's header as placement and adoption see it (S40).
pub(super) fn placed(h: &crate::store::RecordHeader) -> agentloop_core::adopt::Placed<'_> {
    agentloop_core::adopt::Placed {
        session: &h.session_id,
        kind: &h.agent_kind,
        version: h.agent_version,
    }
}
