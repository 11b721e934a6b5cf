// ls_job — the runtime's job thread (ls_actor_job, ls_actor_job_result, ls_actor.h): work off
// the loop, run in order on one thread and completed on the loop in the same order. A room of
// its own because it is the runtime's only second thread: everything here that both sides
// touch is under job_lock, and no other part of an actor's state needs a lock.
#define _GNU_SOURCE
#include "ls_actor_impl.h"

static void *s_job_thread(void *arg) {
    ls_actor_t *self = arg;
    pthread_mutex_lock(&self->job_lock);
    for (;;) {
        s_job_t *job = self->jobs;
        while (job && job->finished)
            job = job->next;
        if (!job) {
            if (self->job_quit)
                break;
            pthread_cond_wait(&self->job_cond, &self->job_lock);
            continue;
        }
        pthread_mutex_unlock(&self->job_lock);
        job->work(job->arg);
        pthread_mutex_lock(&self->job_lock);
        job->finished = 1;
        ev_async_send(self->loop, &self->job_async);
    }
    pthread_mutex_unlock(&self->job_lock);
    return NULL;
}

void actor_job_async_cb(struct ev_loop *loop, ev_async *w, int revents) {
    ls_actor_t *self = w->data;
    for (;;) {
        pthread_mutex_lock(&self->job_lock);
        s_job_t *job = self->jobs;
        // Completions run strictly in submission order, so a replay sees the same order.
        if (!job || !job->finished) {
            pthread_mutex_unlock(&self->job_lock);
            return;
        }
        self->jobs = job->next;
        if (!self->jobs)
            self->jobs_tail = NULL;
        pthread_mutex_unlock(&self->job_lock);
        // A job finished after an earlier `done` stopped the actor completes nothing, and so
        // is not recorded either: a replay stops where the actor did.
        if (!self->stopping) {
            self->now_ns = ls_mono_ns();
            ls_frame_ref_t result = {job->result, job->result_size};
            actor_trace_event(self, LS_TRACE_JOB, job->id, &result, job->result ? 1 : 0);
            job->done(self, job->arg);
        }
        free(job);
    }
}

int ls_actor_job(ls_actor_t *self, ls_job_work_fn work, ls_job_done_fn done, void *arg) {
    return ls_actor_job_result(self, work, done, arg, NULL, 0);
}

int ls_actor_job_result(ls_actor_t *self, ls_job_work_fn work, ls_job_done_fn done, void *arg, void *result,
                        size_t result_size) {
    s_job_t *job = calloc(1, sizeof *job);
    if (!job)
        return -1;
    // Replay runs a job where the trace completes it, on the loop: no thread.
    if (!self->job_thread_started && !self->replay) {
        if (pthread_create(&self->job_thread, NULL, s_job_thread, self) != 0) {
            free(job);
            return -1;
        }
        self->job_thread_started = 1;
    }
    job->id = ++self->next_job_id;
    job->work = work;
    job->done = done;
    job->arg = arg;
    job->result = result;
    job->result_size = result_size;
    pthread_mutex_lock(&self->job_lock);
    if (self->jobs_tail)
        self->jobs_tail->next = job;
    else
        self->jobs = job;
    self->jobs_tail = job;
    pthread_cond_signal(&self->job_cond);
    pthread_mutex_unlock(&self->job_lock);
    return 0;
}

// Waits for the job in progress, then drops what was never completed on the loop: the
// actor is going away, and a `done` must not run on a half-destroyed actor. Idempotent.
void actor_jobs_stop(ls_actor_t *self) {
    if (self->jobs_stopped)
        return;
    self->jobs_stopped = 1;
    if (self->job_thread_started) {
        pthread_mutex_lock(&self->job_lock);
        self->job_quit = 1;
        // Unstarted jobs are skipped: mark them finished so the thread exits.
        for (s_job_t *j = self->jobs; j; j = j->next)
            j->finished = 1;
        pthread_cond_signal(&self->job_cond);
        pthread_mutex_unlock(&self->job_lock);
        pthread_join(self->job_thread, NULL);
    }
    while (self->jobs) {
        s_job_t *j = self->jobs;
        self->jobs = j->next;
        free(j);
    }
    ev_async_stop(self->loop, &self->job_async);
    pthread_mutex_destroy(&self->job_lock);
    pthread_cond_destroy(&self->job_cond);
}

