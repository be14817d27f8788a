//! Fault rules: what the sink does instead of, or around, its normal answer at one phase of a
//! session. Pure: parsing, validation and the "which rule fires" decision, no I/O.
//!
//! A rule that could never match is refused when it is set rather than silently never firing:
//! the key is only known once the message has been read, so `key=` needs `phase=dot`; a
//! recipient is only known from RCPT on, so `rcpt=` needs `rcpt`, `data` or `dot`.
//!
//! `phase=webhook` rules act on the signed events the sink posts for accepted messages
//! (`--webhook`), not on the SMTP session: they are tried once per event batch, in the order
//! the batches are planned (injection, then delivery, then bounce), when the message is accepted.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where in the session a rule acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultStage {
    /// The greeting (after the TLS handshake in implicit TLS mode).
    Connect,
    /// EHLO or HELO.
    Ehlo,
    Mail,
    /// Each RCPT command; a `rcpt=` match looks at the recipient of that command.
    Rcpt,
    /// The DATA command itself (before `354`).
    Data,
    /// The final `.`: the message has been read completely.
    Dot,
    /// An event batch the sink is about to post to its webhook (one per event type and
    /// accepted message); the key and recipients are the message's.
    Webhook,
}

impl FaultStage {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FaultStage::Connect => "connect",
            FaultStage::Ehlo => "ehlo",
            FaultStage::Mail => "mail",
            FaultStage::Rcpt => "rcpt",
            FaultStage::Data => "data",
            FaultStage::Dot => "dot",
            FaultStage::Webhook => "webhook",
        }
    }

    fn knows_recipients(self) -> bool {
        matches!(
            self,
            FaultStage::Rcpt | FaultStage::Data | FaultStage::Dot | FaultStage::Webhook
        )
    }

    fn knows_key(self) -> bool {
        matches!(self, FaultStage::Dot | FaultStage::Webhook)
    }
}

impl FromStr for FaultStage {
    type Err = FaultError;

    fn from_str(s: &str) -> Result<Self, FaultError> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "connect" => FaultStage::Connect,
            "ehlo" | "helo" => FaultStage::Ehlo,
            "mail" => FaultStage::Mail,
            "rcpt" => FaultStage::Rcpt,
            "data" => FaultStage::Data,
            "dot" => FaultStage::Dot,
            "webhook" => FaultStage::Webhook,
            _ => return Err(FaultError(format!("unknown phase {s:?}"))),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultAction {
    /// Answer `code text` instead of the normal reply; nothing is accepted at this phase.
    /// A 421 also closes the connection, as it does on a real server.
    Reply {
        phase: FaultStage,
        code: u16,
        text: String,
    },
    /// Read the whole message, commit it exactly as a normal answer would (accepted, or
    /// replayed / refused by the idempotency check), then close without replying: the
    /// RFC 1047 "committed, reply lost" case.
    DropAfterDot,
    /// Wait before the normal reply. At `dot` the message is committed before the wait, and a
    /// retry under the same key during the wait gets E01004 (still in progress).
    DelayReply { phase: FaultStage, delay: Duration },
    /// Close without a reply at this phase; nothing is accepted.
    Disconnect { phase: FaultStage },
    /// Misbehaves with one webhook event batch (`phase=webhook`).
    Webhook(WebhookFault),
}

/// What a `phase=webhook` rule does to the event batch it fires on. Each of them is something
/// a real at-least-once sender does, which the receiver has to take in its stride.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookFault {
    /// Post the batch a second time (same webhook-id, same body) once the first delivery is
    /// over.
    Duplicate,
    /// Post the injection batch only after the message's later batches (delivery, bounce)
    /// are done. Fires on injection batches only.
    Reorder,
    /// Hold the batch this long before its first post.
    Late(Duration),
    /// Treat the first 2xx as lost and post the batch again (same webhook-id, same body), as
    /// a sender whose connection broke after the receiver had committed.
    LoseAck,
}

impl WebhookFault {
    fn name(self) -> &'static str {
        match self {
            WebhookFault::Duplicate => "duplicate",
            WebhookFault::Reorder => "reorder",
            WebhookFault::Late(_) => "late",
            WebhookFault::LoseAck => "lose_ack",
        }
    }
}

impl FaultAction {
    pub(crate) fn phase(&self) -> FaultStage {
        match self {
            FaultAction::Reply { phase, .. }
            | FaultAction::DelayReply { phase, .. }
            | FaultAction::Disconnect { phase } => *phase,
            FaultAction::DropAfterDot => FaultStage::Dot,
            FaultAction::Webhook(_) => FaultStage::Webhook,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            FaultAction::Reply { .. } => "reply",
            FaultAction::DropAfterDot => "drop",
            FaultAction::DelayReply { .. } => "delay",
            FaultAction::Disconnect { .. } => "disconnect",
            FaultAction::Webhook(fault) => fault.name(),
        }
    }
}

/// One rule: an action, optional conditions, and how many times it may fire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RuleSpec", into = "RuleSpec")]
pub struct FaultRule {
    pub action: FaultAction,
    /// Fires only when the message's idempotency key contains this (case-sensitive); at
    /// `dot` and `webhook`.
    pub key: Option<String>,
    /// Fires only when a recipient contains this (ASCII case-insensitive).
    pub rcpt: Option<String>,
    /// Fires this many times, then is spent; `None` fires forever.
    pub times: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid fault rule: {0}")]
pub struct FaultError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, FaultError> {
    Err(FaultError(msg.into()))
}

impl FaultRule {
    pub(crate) fn new(action: FaultAction) -> Self {
        FaultRule {
            action,
            key: None,
            rcpt: None,
            times: None,
        }
    }

    /// `Reply` with the default text `<class>.0.0 sink fault at <phase>` when `text` is empty.
    pub fn reply(phase: FaultStage, code: u16, text: &str) -> Self {
        let text = if text.is_empty() {
            default_text(phase, code)
        } else {
            text.to_string()
        };
        FaultRule::new(FaultAction::Reply { phase, code, text })
    }

    pub fn drop_after_dot() -> Self {
        FaultRule::new(FaultAction::DropAfterDot)
    }

    pub fn delay(phase: FaultStage, delay: Duration) -> Self {
        FaultRule::new(FaultAction::DelayReply { phase, delay })
    }

    pub fn disconnect(phase: FaultStage) -> Self {
        FaultRule::new(FaultAction::Disconnect { phase })
    }

    pub fn webhook(fault: WebhookFault) -> Self {
        FaultRule::new(FaultAction::Webhook(fault))
    }

    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    pub fn with_rcpt(mut self, rcpt: impl Into<String>) -> Self {
        self.rcpt = Some(rcpt.into());
        self
    }

    pub fn with_times(mut self, times: u32) -> Self {
        self.times = Some(times);
        self
    }

    pub(crate) fn validate(&self) -> Result<(), FaultError> {
        let phase = self.action.phase();
        if let FaultAction::Reply { code, text, .. } = &self.action {
            if !(400..=599).contains(code) {
                return err(format!("reply code {code} is not 4xx/5xx"));
            }
            if text.contains(['\r', '\n']) {
                return err("reply text must be one line");
            }
        }
        if self.key.is_some() && !phase.knows_key() {
            return err("key= needs phase=dot or webhook (the key is read from the message)");
        }
        if self.rcpt.is_some() && !phase.knows_recipients() {
            return err("rcpt= needs phase=rcpt, data, dot or webhook");
        }
        if self.times == Some(0) {
            return err("times=0 would never fire");
        }
        Ok(())
    }

    fn matches(&self, phase: FaultStage, ctx: &Context<'_>) -> bool {
        if self.action.phase() != phase {
            return false;
        }
        if self.action == FaultAction::Webhook(WebhookFault::Reorder)
            && ctx.event != Some("injection")
        {
            return false;
        }
        if let Some(want) = &self.key {
            if !ctx.key.is_some_and(|k| k.contains(want.as_str())) {
                return false;
            }
        }
        if let Some(want) = &self.rcpt {
            let want = want.to_ascii_lowercase();
            if !ctx
                .rcpts
                .iter()
                .any(|r| r.to_ascii_lowercase().contains(&want))
            {
                return false;
            }
        }
        true
    }
}

fn default_text(phase: FaultStage, code: u16) -> String {
    format!("{}.0.0 sink fault at {}", code / 100, phase.as_str())
}

/// What a rule may look at when the session reaches a phase.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Context<'a> {
    pub key: Option<&'a str>,
    /// At `rcpt` the recipient of the command; at `data`/`dot`/`webhook` the whole envelope.
    pub rcpts: &'a [String],
    /// At `webhook`: the type of the batch's events (`injection`, `delivery`, `bounce`).
    pub event: Option<&'a str>,
}

/// A rule as reported back, with how often it has fired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleStatus {
    #[serde(flatten)]
    pub rule: FaultRule,
    pub fired: u32,
}

/// The active rules, in order, with their fire counts.
#[derive(Debug, Clone, Default)]
pub(crate) struct FaultSet {
    rules: Vec<RuleStatus>,
}

impl FaultSet {
    pub(crate) fn new(rules: Vec<FaultRule>) -> Result<Self, FaultError> {
        for rule in &rules {
            rule.validate()?;
        }
        Ok(FaultSet {
            rules: rules
                .into_iter()
                .map(|rule| RuleStatus { rule, fired: 0 })
                .collect(),
        })
    }

    pub(crate) fn status(&self) -> Vec<RuleStatus> {
        self.rules.clone()
    }

    /// Appends rules after the active ones, whose fire counts go on; all or nothing.
    pub(crate) fn extend(&mut self, rules: Vec<FaultRule>) -> Result<(), FaultError> {
        let added = FaultSet::new(rules)?;
        self.rules.extend(added.rules);
        Ok(())
    }

    /// The first unspent rule for `phase` whose conditions hold fires (and is counted).
    pub(crate) fn fire(&mut self, phase: FaultStage, ctx: &Context<'_>) -> Option<FaultRule> {
        let status = self.rules.iter_mut().find(|s| {
            s.rule.times.is_none_or(|times| s.fired < times) && s.rule.matches(phase, ctx)
        })?;
        status.fired += 1;
        Some(status.rule.clone())
    }
}

/// The flat shape shared by the CLI string and the JSON form:
/// `{"phase":"dot","action":"drop","times":1,"key":"abc"}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    phase: Option<FaultStage>,
    action: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    times: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rcpt: Option<String>,
}

impl TryFrom<RuleSpec> for FaultRule {
    type Error = FaultError;

    fn try_from(spec: RuleSpec) -> Result<Self, FaultError> {
        let phase = |default: Option<FaultStage>| match spec.phase.or(default) {
            Some(p) => Ok(p),
            None => err(format!("action={} needs phase=", spec.action)),
        };
        let unused = |name: &str, present: bool| {
            if present {
                err(format!("{name}= does not apply to action={}", spec.action))
            } else {
                Ok(())
            }
        };
        let smtp_phase = |default: Option<FaultStage>| {
            let p = phase(default)?;
            if p == FaultStage::Webhook {
                return err(format!(
                    "action={} does not exist at phase=webhook (duplicate, reorder, late, lose_ack)",
                    spec.action
                ));
            }
            Ok(p)
        };
        let webhook = |fault: WebhookFault| {
            unused("code", spec.code.is_some())?;
            unused("text", spec.text.is_some())?;
            if !matches!(fault, WebhookFault::Late(_)) {
                unused("ms", spec.ms.is_some())?;
            }
            if phase(Some(FaultStage::Webhook))? != FaultStage::Webhook {
                return err(format!(
                    "action={} only exists at phase=webhook",
                    spec.action
                ));
            }
            Ok(FaultAction::Webhook(fault))
        };
        let action = match spec.action.to_ascii_lowercase().as_str() {
            "duplicate" => webhook(WebhookFault::Duplicate)?,
            "reorder" => webhook(WebhookFault::Reorder)?,
            "lose_ack" => webhook(WebhookFault::LoseAck)?,
            "late" => {
                let Some(ms) = spec.ms else {
                    return err("action=late needs ms=");
                };
                webhook(WebhookFault::Late(Duration::from_millis(ms)))?
            }
            "reply" => {
                unused("ms", spec.ms.is_some())?;
                let phase = smtp_phase(None)?;
                let Some(code) = spec.code else {
                    return err("action=reply needs code=");
                };
                let text = match spec.text.as_deref() {
                    Some(t) if !t.trim().is_empty() => t.trim().to_string(),
                    _ => default_text(phase, code),
                };
                FaultAction::Reply { phase, code, text }
            }
            "drop" => {
                unused("code", spec.code.is_some())?;
                unused("text", spec.text.is_some())?;
                unused("ms", spec.ms.is_some())?;
                if phase(Some(FaultStage::Dot))? != FaultStage::Dot {
                    return err("action=drop only exists at phase=dot");
                }
                FaultAction::DropAfterDot
            }
            "delay" => {
                unused("code", spec.code.is_some())?;
                unused("text", spec.text.is_some())?;
                let Some(ms) = spec.ms else {
                    return err("action=delay needs ms=");
                };
                FaultAction::DelayReply {
                    phase: smtp_phase(None)?,
                    delay: Duration::from_millis(ms),
                }
            }
            "disconnect" => {
                unused("code", spec.code.is_some())?;
                unused("text", spec.text.is_some())?;
                unused("ms", spec.ms.is_some())?;
                FaultAction::Disconnect {
                    phase: smtp_phase(None)?,
                }
            }
            other => {
                return err(format!(
                    "unknown action {other:?} (reply, drop, delay, disconnect; at phase=webhook: \
                     duplicate, reorder, late, lose_ack)"
                ))
            }
        };
        let rule = FaultRule {
            action,
            key: spec.key,
            rcpt: spec.rcpt,
            times: spec.times,
        };
        rule.validate()?;
        Ok(rule)
    }
}

impl From<FaultRule> for RuleSpec {
    fn from(rule: FaultRule) -> Self {
        let mut spec = RuleSpec {
            phase: Some(rule.action.phase()),
            action: rule.action.name().to_string(),
            times: rule.times,
            key: rule.key,
            rcpt: rule.rcpt,
            ..RuleSpec::default()
        };
        match rule.action {
            FaultAction::Reply { code, text, .. } => {
                spec.code = Some(code);
                spec.text = Some(text);
            }
            FaultAction::DelayReply { delay, .. }
            | FaultAction::Webhook(WebhookFault::Late(delay)) => {
                spec.ms = Some(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
            }
            FaultAction::DropAfterDot
            | FaultAction::Disconnect { .. }
            | FaultAction::Webhook(_) => {}
        }
        spec
    }
}

/// `name=value` pairs separated by commas; `text=` takes the rest of the string, commas
/// included, so it goes last.
impl FromStr for FaultRule {
    type Err = FaultError;

    fn from_str(s: &str) -> Result<Self, FaultError> {
        let mut spec = RuleSpec::default();
        let mut action = None;
        let mut rest = s.trim();
        while !rest.is_empty() {
            let Some((name, after)) = rest.split_once('=') else {
                return err(format!("expected name=value, got {rest:?}"));
            };
            let name = name.trim().to_ascii_lowercase();
            let (value, next) = if name == "text" {
                (after, "")
            } else {
                after.split_once(',').unwrap_or((after, ""))
            };
            let value = value.trim();
            let dup = |present: bool| {
                if present {
                    err(format!("{name}= given twice"))
                } else {
                    Ok(())
                }
            };
            let number = |what: &str| {
                value
                    .parse::<u64>()
                    .map_err(|_| FaultError(format!("{what}={value:?} is not a number")))
            };
            match name.as_str() {
                "phase" => {
                    dup(spec.phase.is_some())?;
                    spec.phase = Some(value.parse()?);
                }
                "action" => {
                    dup(action.is_some())?;
                    action = Some(value.to_string());
                }
                "code" => {
                    dup(spec.code.is_some())?;
                    let code = number("code")?;
                    spec.code = Some(u16::try_from(code).unwrap_or(u16::MAX));
                }
                "text" => spec.text = Some(value.to_string()),
                "ms" => {
                    dup(spec.ms.is_some())?;
                    spec.ms = Some(number("ms")?);
                }
                "times" => {
                    dup(spec.times.is_some())?;
                    let times = number("times")?;
                    spec.times = Some(u32::try_from(times).unwrap_or(u32::MAX));
                }
                "key" => {
                    dup(spec.key.is_some())?;
                    spec.key = Some(value.to_string());
                }
                "rcpt" => {
                    dup(spec.rcpt.is_some())?;
                    spec.rcpt = Some(value.to_string());
                }
                other => {
                    return err(format!(
                        "unknown field {other:?} (phase, action, code, text, ms, times, key, rcpt)"
                    ))
                }
            }
            rest = next.trim_start();
        }
        let Some(action) = action else {
            return err("action= is required");
        };
        spec.action = action;
        FaultRule::try_from(spec)
    }
}

impl fmt::Display for FaultRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let spec = RuleSpec::from(self.clone());
        write!(
            f,
            "phase={},action={}",
            self.action.phase().as_str(),
            spec.action
        )?;
        if let Some(code) = spec.code {
            write!(f, ",code={code}")?;
        }
        if let Some(ms) = spec.ms {
            write!(f, ",ms={ms}")?;
        }
        if let Some(times) = spec.times {
            write!(f, ",times={times}")?;
        }
        if let Some(key) = &spec.key {
            write!(f, ",key={key}")?;
        }
        if let Some(rcpt) = &spec.rcpt {
            write!(f, ",rcpt={rcpt}")?;
        }
        if let Some(text) = &spec.text {
            write!(f, ",text={text}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
